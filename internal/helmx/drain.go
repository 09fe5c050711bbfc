// Draining the fence before the lock is given back: counting helm's writes
// in flight and its record updates, refusing new writes once closed, and
// waiting out writes that ended with no answer.

package helmx

import (
	"errors"
	"sync"
	"time"
)

// errClosed refuses helm's writes once the fence is drained.
var errClosed = errors.New("the operation is ending and its lock is being given back: nothing more of it is written")

// Drain closes the fence: from now on it refuses every write of helm's,
// stops sending any record update again after a failure, and it returns
// only once no write of helm's it let through can still land: each has
// ended (by its deadline at the latest, the lock's renew deadline when it
// left), and the deadline of each that ended with no answer from the API
// server (which may still be committing it; the write's timeout parameter
// is that deadline) has passed. Call it before the lock is released and
// before the holder marks its own revision failed: helm does not cancel
// its rollback or uninstall on a signal (nor the rollback an upgrade's
// --rollback-on-failure runs), and helm 4 leaves the write that marks the
// previous revision superseded running when it is interrupted; none of
// their writes may land once the lock is free. On the happy path nothing
// is in flight and it returns at once. Guard opens the fence again.
func (w *WriteFence) Drain() {
	w.mu.Lock()
	w.closeLocked()
	for w.updates > 0 || w.inflight > 0 {
		w.endedCond().Wait()
	}
	until := w.unanswered
	w.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
}

// closeLocked closes the fence (Drain, CloseUnlessBusy): from now on it
// refuses every write of helm's, until Guard opens it for another
// operation; w.mu is held.
func (w *WriteFence) closeLocked() {
	w.closed = true
	if w.draining != nil {
		select {
		case <-w.draining:
		default:
			close(w.draining)
		}
	}
}

// isClosed reports whether Drain or CloseUnlessBusy closed the fence.
func (w *WriteFence) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// writeStarted counts one of helm's writes into the fence, unless Drain
// closed it, and records what it says of helm's phase (p), and returns
// the function that counts it out.
func (w *WriteFence) writeStarted(p phaseOf) (ended func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errClosed
	}
	w.phase.apply(p)
	w.inflight++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.inflight--
		w.endedCond().Broadcast()
	}, nil
}

// unansweredUntil notes a write that left and ended with no answer: it may
// land until its deadline (see Drain).
func (w *WriteFence) unansweredUntil(deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if deadline.After(w.unanswered) {
		w.unanswered = deadline
	}
}

// endedCond is w.ended, made on first use; w.mu is held.
func (w *WriteFence) endedCond() *sync.Cond {
	if w.ended == nil {
		w.ended = sync.NewCond(&w.mu)
	}
	return w.ended
}

// updateStarted counts one of helm's record updates into the fence and
// returns the channel Drain closes and the function that counts it out.
func (w *WriteFence) updateStarted() (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates++
	return w.draining, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.updates--
		w.endedCond().Broadcast()
	}
}
