package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Guarded is one helm operation run under a lock (Lock.Run): what recovery
// may do first, the operation, and the door's own parts of the sequence.
type Guarded struct {
	// Procedure is the recovery run before the operation; its Next is the
	// operation (install, upgrade, rollback, uninstall).
	Procedure Procedure
	// Decided is told recovery's outcome before the operation starts; an
	// error it returns ends Run with that error, without the operation (a
	// blocked release). nil lets every outcome but a Blocked one go on.
	Decided func(Outcome) error
	// Op is the operation. Its context is Run's.
	Op func(ctx context.Context) error
	// OnLost is called once when the lock is lost (taken over, not renewed
	// before its renew deadline, held past its maximum hold) while Run
	// holds it: the door stops the operation (the fence refuses its writes
	// anyway).
	OnLost func(error)
	// Releasing, when set, is called just before the lock is given back,
	// with Run's error so far, and reports whether the lock is deleted
	// rather than released (an uninstall that kept no history, an
	// operation that wrote no revision of a release that had none).
	Releasing func(ctx context.Context, err error) (deleteLock bool)
	// Released is told the error of giving the lock back (nil, or the lock
	// was lost already, which is not an error: it runs out by itself).
	Released func(err error)
	// Log receives the messages about the objects recovery left for after
	// the operation (Procedure.Log receives recovery's own progress).
	Log io.Writer

	// Preemptible makes the operation stop when a waiter asks it to
	// (Request.Preempt; see preempt.go): once it may (an install or an
	// upgrade, no hook running), the fence is drained, Op's context is
	// cancelled with a *PreemptedError as its cause, and Preempted, when
	// set, is told (a door whose operation does not end with its context
	// ends it itself). Its revision is marked failed naming the asker and
	// Run returns an error wrapping ErrPreempted. Declined is told, once,
	// why the operation does not stop yet when asked.
	Preemptible bool
	Preempted   func(*PreemptedError)
	Declined    func(by Waiter, why string)
}

// ErrBlocked is Run's refusal to run an operation on a release that is
// pending and may not be recovered now (Guarded.Decided decides otherwise).
var ErrBlocked = errors.New("release is pending and may not be recovered now")

// Run is the guarded sequence every door runs around one helm operation:
// renew the lock from the start (Keep), recover what an expired holder
// left (Recover, when the storage driver keeps records), record the
// revision the operation will write (SetRevision), run it, remove what
// recovery left for after it that its revision does not render
// (RemoveDeferred), and give the lock back (Release, which drains the
// fence; or ReleaseAndDelete), on every path. It returns the first error:
// recovery's, the door's (Decided), the lock's, the operation's.
func (l *Lock) Run(ctx context.Context, g Guarded) (err error) {
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeep()
	onLost := g.OnLost
	if onLost == nil {
		onLost = func(error) {}
	}
	go l.Keep(keepCtx, onLost)
	defer func() {
		stopKeep()
		l.End(ctx, g, err)
	}()

	out := Outcome{Latest: 0}
	if _, rerr := l.conn.Records(); rerr == nil {
		out, err = l.Recover(ctx, g.Procedure)
		if err != nil {
			return err
		}
	}
	decided := g.Decided
	if decided == nil {
		decided = func(o Outcome) error {
			if o.Decision.Verdict == recovery.Blocked {
				return fmt.Errorf("%w: %s", ErrBlocked, o.Decision.Reason)
			}
			return nil
		}
	}
	if err := decided(out); err != nil {
		return err
	}
	rev, err := l.NextRevision(ctx, g.Procedure.Next, out.Latest)
	if err != nil {
		return err
	}
	if err := l.SetRevision(ctx, rev); err != nil {
		return err
	}
	err = l.runOp(ctx, g)
	switch {
	case err != nil && SQLRefused(err) && !errors.Is(err, ErrLost):
		// The sql driver's database refused helm's write: this session
		// no longer holds the release's lock row.
		err = fmt.Errorf("%w: %w", ErrLost, err)
	case err == nil && l.conn.sql != nil:
		err = l.checkSQLWritten(ctx, g.Procedure.Next, rev, g.Log)
	}
	if err != nil && rev > 0 {
		// helm's operation failed: it may have left the revision it wrote
		// pending (an uninstall whose deletes failed leaves it
		// uninstalling; a write of helm's to the sql driver's database
		// that did not land is not seen by the fence). The release reads
		// it and, when it is still pending under this lock, marks it
		// failed (settleOwn), so the next client need not take it for
		// stock helm's. Nothing is read on the happy path. The newest
		// revision the session wrote too (an upgrade's
		// --rollback-on-failure writes the rollback's after its own).
		l.OwnRecordWrite(rev, false)
		if newest := l.Record().Revision; newest > rev {
			l.OwnRecordWrite(newest, false)
		}
	}
	if d := out.Converged.Deferred; !d.Empty() {
		// What only the abandoned revision rendered goes once the
		// operation's revision says it is not wanted; nothing on the
		// happy path.
		_, derr := l.conn.RemoveDeferred(context.WithoutCancel(ctx), l, d, g.Log)
		switch {
		case derr == nil, errors.Is(derr, recovery.ErrNoNewRevision):
			// (the warning is written already)
		case errors.Is(derr, ErrLost):
			if err == nil {
				err = derr
			}
		default:
			if g.Log != nil {
				fmt.Fprintf(g.Log, "helm-autorecover: warning: %v\n", derr)
			}
		}
	}
	return err
}

// End gives the lock back as Run does once the operation ended with err:
// it first drains the lock's write fence (no write let through it can land
// any more: a create answered 5xx may still commit until its deadline),
// then Releasing decides whether the lock is deleted, with what that write
// left in place to read, and Released is told how giving it back went;
// last, the fence stops judging writes by this lock. A door that must end
// the process before Run returns (a signal, the fail-stop) calls it itself;
// only the first call does anything. Once drained, it gives the lock back
// within 10 s even when ctx has ended.
func (l *Lock) End(ctx context.Context, g Guarded, err error) {
	l.endOnce.Do(func() {
		l.drain()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var rerr error
		if g.Releasing != nil && g.Releasing(rctx, err) {
			rerr = l.ReleaseAndDelete(rctx)
		} else {
			rerr = l.Release(rctx)
		}
		if errors.Is(rerr, ErrLost) {
			rerr = nil
		}
		if l.unfence != nil {
			l.unfence()
		}
		if g.Released != nil {
			g.Released(rerr)
		}
	})
}

// checkSQLWritten reads the revision rev a successful operation wrote to
// the sql driver's database: helm's sql driver ignores a failed commit of
// its create (the server ended the transaction, a failover), and would
// report success for a revision that was never stored, or left pending;
// its delete too, which would leave an uninstall's revision uninstalling.
// A revision left pending is then settled by Run's failed path, while the
// lock is held.
func (l *Lock) checkSQLWritten(ctx context.Context, op Operation, rev int, log io.Writer) error {
	recs, rerr := l.conn.Records()
	if rev <= 0 || rerr != nil {
		return nil
	}
	rec, err := recs.Get(ctx, l.namespace, helmx.ReleaseSecretName(l.release, rev))
	if op == OpUninstall && apierrors.IsNotFound(err) {
		// Removed with its history (no --keep-history).
		return nil
	}
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("release %q in namespace %q: helm reported success, but revision %d is not in its sql database (helm's sql driver ignores a failed commit); check the release with helm history %s -n %s before the next operation",
			l.release, l.namespace, rev, l.release, l.namespace)
	}
	if err != nil {
		if log != nil {
			fmt.Fprintf(log, "helm-autorecover: release %q in namespace %q: could not read back revision %d from the sql database: %v\n", l.release, l.namespace, rev, err)
		}
		return nil
	}
	if s, err := helmx.SummarizeRecord(rec); err == nil && recovery.IsPending(s.Status) {
		return fmt.Errorf("release %q in namespace %q: helm reported success, but revision %d is still %s in its sql database (a write of helm's did not land)",
			l.release, l.namespace, rev, s.Status)
	}
	return nil
}

// runOp runs g's operation; when it is preemptible, beside the watch of the
// lock's queue for a request to stop (watchAsks).
func (l *Lock) runOp(ctx context.Context, g Guarded) error {
	if !g.Preemptible {
		return g.Op(ctx)
	}
	opCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if l.fence != nil {
		l.fence.ResetPhase()
	}
	endAsks := l.watchAsks(ctx, g.Procedure.Next, g.Declined, func(p *PreemptedError) {
		cancel(p)
		if g.Preempted != nil {
			g.Preempted(p)
		}
	})
	err := g.Op(opCtx)
	l.OperationEnded()
	endAsks()
	if p := l.Preempted(); p != nil {
		// Stopped at a waiter's request, before helm settled its
		// revision: preempted, whatever helm returned (its install
		// returns success when its last record write is refused).
		if err != nil {
			return fmt.Errorf("%w: %w", p, err)
		}
		return p
	}
	return err
}

// OperationEnded tells the lock that helm's operation returned (a door
// whose operation ends the process calls it as soon as helm returns): a
// request to stop that comes later is not acted on.
func (l *Lock) OperationEnded() {
	if l.fence != nil {
		l.fence.OperationEnded()
	}
}
