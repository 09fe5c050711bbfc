package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Cooperative preemption (issue 34). A client that waits with
// Request.Preempt marks its queue entry as a request that the holder stop.
// The holder, while its install or upgrade runs (Guarded.Preemptible),
// watches its lock's queue and, when asked, stops as on a first SIGINT:
// the write fence is drained (nothing more of helm's is written), the
// operation is cancelled, its revision is marked failed naming who asked,
// and the lock goes back to the queue, whose head takes it. A holder that
// cannot stop safely at that moment (helm's rollback and uninstall do not
// cancel; a hook of the chart is running) says why and goes on; the asker
// keeps waiting. Nothing is ever taken from a holder that does not stop: the
// request only asks.

// Waiter is a client queued for a release's lock.
type Waiter = lock.Waiter

// ErrPreempted is wrapped by the error of an operation its holder stopped
// because a waiter asked it to (PreemptedError).
var ErrPreempted = errors.New("preempted")

// PreemptedError is the end of an operation stopped at a waiter's request.
type PreemptedError struct {
	Release, Namespace string
	// By is the waiter that asked.
	By Waiter
}

func (e *PreemptedError) Error() string {
	return fmt.Sprintf("release %q in namespace %q: stopped at the request of %s (--preempt)", e.Release, e.Namespace, Asker(e.By))
}

func (e *PreemptedError) Unwrap() error { return ErrPreempted }

// Asker names a waiter that asked to preempt, for people: who, session,
// and the operation it waits to run.
func Asker(w Waiter) string {
	who := w.Who
	if who == "" {
		who = "an unnamed client"
	}
	if w.Operation != "" {
		return fmt.Sprintf("%s (session %s, waiting to %s)", who, w.Session, w.Operation)
	}
	return fmt.Sprintf("%s (session %s)", who, w.Session)
}

// DescriptionPreempted is written into the revision of an operation its
// holder stopped at a waiter's request. Verbs: the pending status, the
// asker (Asker), the holder's session, the server time.
const DescriptionPreempted = "Preempted %s: stopped at the request of %s; marked failed by its own holder, helm-autorecover session %s, at %s"

// askPollSQL is how often a holder whose helm writes its records to the sql
// driver's database judges again whether helm may be stopped (sqlBusy).
const askPollSQL = time.Second

// askWatchAfter is how long an operation runs before its holder starts
// watching for a request to stop: an operation that ends sooner (a no-wait
// upgrade takes half a second) costs no request for it, and one in helm's
// --wait notices a request within a round trip from then on.
const askWatchAfter = time.Second

// Preemptible reports whether an operation of kind op may be stopped at a
// waiter's request, and why not: helm cancels its install and upgrade, not
// its rollback or uninstall (an uninstall stopped half-way leaves some of
// the release's objects deleted and others not).
func Preemptible(op Operation) (bool, string) {
	switch op {
	case OpInstall, OpUpgrade:
		return true, ""
	case OpRollback:
		return false, "helm cannot cancel a rollback"
	case OpUninstall:
		return false, "helm cannot cancel an uninstall"
	default:
		return false, "a " + string(op) + " is not stopped at a waiter's request"
	}
}

// watchAsks runs, beside the operation op, the holder's side of
// preemption: from askWatchAfter on, it watches the lock's queue for a
// request to stop this holder. While helm cannot be stopped safely (op is
// not Preemptible; a hook runs; helm undoes the release), declined is told
// why, once per asker, and the holder waits for helm's next change of
// phase, then reads its queue again: it stops only for an asker still
// waiting. To stop, it closes the write fence in the same step as it
// judges helm stoppable (helmx.WriteFence.CloseUnlessBusy), drains it,
// marks its own revision to be settled as preempted, and calls stop. It
// returns the function that ends the watch (the operation ended).
func (l *Lock) watchAsks(ctx context.Context, op Operation, declined func(by Waiter, why string), stop func(*PreemptedError)) (end func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := l.conn.clock.NewTimer(askWatchAfter)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		if l.awaitStoppable(ctx, op, declined) {
			l.stopFor(stop)
		}
	}()
	return func() { cancel(); <-done }
}

// awaitStoppable waits for a request to stop this holder at a moment helm
// can be stopped; the fence is then closed and the request recorded
// (Preempted), and it reports true. It returns false when ctx ends first.
func (l *Lock) awaitStoppable(ctx context.Context, op Operation, declined func(by Waiter, why string)) bool {
	told := map[string]bool{}
	for ctx.Err() == nil {
		var by *Waiter
		l.held.WatchAsks(ctx, func(w Waiter) { by = &w })
		if by == nil {
			return false
		}
		for {
			why := ""
			var changed <-chan struct{}
			// The request is recorded as the fence closes (so that a
			// write of helm's refused from then on is known to be the
			// preemption's), or not at all.
			p := &PreemptedError{Release: l.release, Namespace: l.namespace, By: *by}
			record := func() {
				l.mu.Lock()
				l.preempted, l.preemptDecided = p, make(chan struct{})
				l.mu.Unlock()
			}
			var again <-chan time.Time
			switch ok, reason := Preemptible(op); {
			case !ok:
				why = reason
			default:
				if why = l.sqlBusy(ctx); why != "" {
					// Judged from the database: look again in a
					// moment, as a holder reads an unwatchable queue.
					again = l.conn.clock.After(askPollSQL)
					break
				}
				if l.fence != nil {
					why, changed = l.fence.CloseUnlessBusy(record)
				} else {
					record()
				}
			}
			switch why {
			case "":
				return true
			case helmx.Ended:
				return false // nothing left to stop
			}
			if !told[by.Session] && declined != nil {
				declined(*by, why)
				told[by.Session] = true
			}
			select {
			case <-ctx.Done():
				return false
			case <-changed: // nil (never) when nothing can change
			case <-again:
			}
			// Helm's phase changed: stop only for an asker still waiting
			// (one that gave up, or was killed, asks nothing).
			w, asked, err := l.held.AskedNow(ctx)
			if err != nil || !asked {
				break // watch again
			}
			by = &w
		}
	}
	return false
}

// stopFor ends the operation at the request recorded (Preempted) once the
// fence is closed: drains it, marks the holder's own revision to be settled
// as preempted (failed, naming the asker, when the lock is given back), and
// calls stop; unless helm's last write had settled the revision already,
// when the request is forgotten (Preempted nil) and helm's outcome stands.
func (l *Lock) stopFor(stop func(*PreemptedError)) {
	l.mu.Lock()
	p, decided := l.preempted, l.preemptDecided
	l.mu.Unlock()
	// Nothing more of helm's is written from now on, before the operation
	// is told: helm's own clean-up of a cancelled operation would mark its
	// revision failed without naming the asker; the holder marks it itself
	// (settleRevision).
	l.drain()
	rev := l.Record().Revision
	l.mu.Lock()
	done := rev > 0 && l.settledWrites[rev]
	if done {
		// helm's last write, which settled the revision, landed before
		// the fence closed: the operation has done its work, and its own
		// outcome stands (helm returns with nothing more to write).
		l.preempted = nil
	}
	l.mu.Unlock()
	close(decided)
	if done {
		return
	}
	if rev > 0 {
		l.OwnRecordWrite(rev, false)
	}
	stop(p)
}

// Preempted returns the request the holder stopped for, nil when none.
// Once the fence was closed for a request, it waits until the holder has
// decided whether the stop took effect (stopFor: helm's last write may
// have settled the revision first).
func (l *Lock) Preempted() *PreemptedError {
	l.mu.Lock()
	decided := l.preemptDecided
	l.mu.Unlock()
	if decided != nil {
		<-decided
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.preempted
}

// sqlBusy says why helm may not be stopped now when its records go to the
// sql driver's database, which the write fence does not see ("" when it
// may, or with any other driver): helm settled or undoes the operation's
// revision (its operation failed, or rolls back: a newer revision than
// the holder's own exists). It reads the history once, on the path of a
// request to stop only.
func (l *Lock) sqlBusy(ctx context.Context) string {
	if l.conn.sql == nil {
		return ""
	}
	own := l.Record().Revision
	hist, err := l.conn.History(ctx, l.namespace, l.release)
	switch {
	case err != nil:
		return "its revisions could not be read from helm's database (" + err.Error() + ")"
	case len(hist) == 0 || own == 0:
		return ""
	}
	newest := hist[len(hist)-1]
	switch {
	case newest.Revision > own:
		return fmt.Sprintf("helm wrote revision %d after the operation's own (a rollback of --rollback-on-failure), which it cannot cancel", newest.Revision)
	case newest.Revision == own && !recovery.IsPending(newest.Status):
		return fmt.Sprintf("helm's operation is ending (revision %d is %s)", own, newest.Status)
	}
	return ""
}
