// Cooperative preemption, the holder's side: noticing that a waiter asked
// it to stop (Waiter.Preempt).

package lock

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// askPoll is how often a holder reads its queue for a request to stop when
// its store cannot be watched (the sql driver's lock row, or a watch the
// API server refused): as often as a waiter reads the lock then
// (progressEvery).
const askPoll = progressEvery

// WatchAsks tells asked, once, of the first live waiter that asked this
// holder to stop (Request.Preempt: a queue entry marked Preempt naming this
// holder's session), until ctx ends. It watches the object
// the lock's queue lives on (the Lease; for the release records the beat,
// where their waiters queue) by name: one watch, whose first event shows
// the queue as it is, so a request made before the watch started is seen
// too. A store that cannot be watched is read every askPoll.
//
// It only reads: what the holder does when asked is its own decision, and
// nothing is ever taken from a holder that does not stop. A waiter whose
// entry has expired in server time asks nothing.
func (h *part) WatchAsks(ctx context.Context, asked func(Waiter)) {
	ns, name := h.req.Namespace, LeaseName(h.req.Release)
	check := func(queue []Waiter) bool {
		if w, ok := h.askIn(queue); ok {
			asked(w)
			return true
		}
		return false
	}
	for ctx.Err() == nil {
		opened := h.b.clock.Now()
		w, queueOf, err := h.b.watchQueue(ctx, ns, name)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if by, ok, err := h.AskedNow(ctx); err == nil && ok {
				asked(by)
				return
			}
			if h.b.sleep(ctx, askPoll) != nil {
				return
			}
			continue
		}
		if h.drainAsks(ctx, w, queueOf, check) {
			return
		}
		// A watch that ended at once (a proxy, an API server restarting)
		// is not opened again at once.
		if h.b.sleep(ctx, askPoll-h.b.clock.Since(opened)) != nil {
			return
		}
	}
}

// askIn returns the first live waiter in queue that asks this holder to
// stop.
func (h *part) askIn(queue []Waiter) (Waiter, bool) {
	now, _ := h.b.time.Now()
	for _, w := range liveWaiters(queue, now, h.b.margin()) {
		if w.Preempt && w.PreemptHolder == h.req.Session {
			return w, true
		}
	}
	return Waiter{}, false
}

// AskedNow reads the lock's queue once and returns the first live waiter
// that asks this holder to stop, if any.
func (h *part) AskedNow(ctx context.Context) (Waiter, bool, error) {
	l, err := h.b.store(h.req.Namespace).Read(ctx, LeaseName(h.req.Release))
	if err != nil {
		return Waiter{}, false, err
	}
	w, ok := h.askIn(l.Queue)
	return w, ok, nil
}

// drainAsks reads w's events until one shows a request to stop (true), ctx
// ends, or the watch closes (the API server ends watches now and then).
func (h *part) drainAsks(ctx context.Context, w watch.Interface, queueOf func(runtime.Object) ([]Waiter, bool), check func([]Waiter) bool) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if q, ok := queueOf(ev.Object); ok && check(q) {
				return true
			}
		}
	}
}

// watchQueue watches the object the lock's queue lives on, and says how to
// read the queue from one of its events.
func (b *Backend) watchQueue(ctx context.Context, ns, name string) (watch.Interface, func(runtime.Object) ([]Waiter, bool), error) {
	return b.store(ns).WatchQueue(ctx, name)
}

// WatchAsks watches the first part's queue, where every waiter queues (the
// parts are taken in order, and a waiter waits for the first it cannot
// take: the holder of all of them holds the first): see part.WatchAsks.
func (j *Held) WatchAsks(ctx context.Context, asked func(Waiter)) {
	j.parts[0].WatchAsks(ctx, asked)
}

// AskedNow reads the first part's queue once: see part.AskedNow.
func (j *Held) AskedNow(ctx context.Context) (Waiter, bool, error) {
	return j.parts[0].AskedNow(ctx)
}
