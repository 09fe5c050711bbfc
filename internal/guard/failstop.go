package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// onLost is the fail-stop: the lock could not be renewed in time or was
// taken, so this process stops before helm writes the release again.
func (r *run) onLost(err error) {
	select {
	case <-r.opDone:
		return
	default:
	}
	if errors.Is(err, protocol.ErrMaxHold) {
		r.exitOnce.Do(func() {
			fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: the operation held its lock longer than --lock-max-hold; aborting. Raise --lock-max-hold or --timeout if it legitimately takes this long.\n",
				r.t.Release, r.t.Namespace)
			r.abandonOwn("the operation exceeded --lock-max-hold")
			r.end()
			r.g.Exit(exitcode.MaxHold)
		})
		return
	}
	r.exitOnce.Do(func() {
		fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: lost the lock (%v); stopping before any further write. Whoever released or took the lock recovers what this operation left pending (helm-autorecover unlock marks it failed itself); if nobody did, the next operation does once the lock has expired (see helm-autorecover locks %s -n %s).\n",
			r.t.Release, r.t.Namespace, err, r.t.Release, r.t.Namespace)
		r.g.Exit(exitcode.LockLost)
	})
}

// abandonOwn marks the revision this operation was writing failed, if it is
// still pending, so a cancelled or aborted operation never leaves it pending.
//
// helm's operation may still be running (helm does not cancel a rollback
// or an uninstall on a signal, nor the rollback of an upgrade's
// --rollback-on-failure), so the fence is closed first: nothing of helm's
// is written after the mark, and the lock, still renewed meanwhile, is
// given back only once no write of helm's already sent can land
// (helmx.WriteFence.Drain).
func (r *run) abandonOwn(why string) {
	r.held.Fence().Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if r.held.Valid() != nil {
		return
	}
	own := r.held.Record().Revision
	for attempt := 0; attempt < 3; attempt++ {
		hist, err := r.history(ctx)
		if err != nil || len(hist) == 0 {
			return
		}
		latest := hist[len(hist)-1]
		if latest.Revision < own || !recovery.IsPending(latest.Status) {
			return
		}
		now, _ := r.conn.ServerNow(ctx)
		desc := fmt.Sprintf("%s %s: %s (session %s at %s)", "Cancelled", latest.Status, why, r.held.Session(), now.Latest.UTC().Format(time.RFC3339))
		recs, _ := r.conn.Records()
		_, err = recovery.MarkFailedHeld(recovery.WithBeforeWrite(ctx, r.held.Valid), recs, r.t.Namespace, latest, r.held.Session(), desc, now.Latest)
		if !errors.Is(err, recovery.ErrConflict) {
			return
		}
	}
}
