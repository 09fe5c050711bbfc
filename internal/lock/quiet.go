package lock

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// watchView is what a waiter knows of the lock between two reads: the lock
// as last read, and the queue as the watch has shown it since.
type watchView struct {
	seen     *Snapshot
	queue    []Waiter
	self     string
	seenLive bool
	wasAhead map[string]bool
}

func newWatchView(seen *Snapshot, self string, seenLive bool) *watchView {
	v := &watchView{seen: seen, self: self, seenLive: seenLive, wasAhead: map[string]bool{}}
	if seen != nil {
		v.queue = seen.Queue
		for _, w := range v.queue {
			if w.Session == self {
				break
			}
			v.wasAhead[w.Session] = true
		}
	}
	return v
}

// quiet reports a change to the lock, seen while waiting, that cannot make
// this waiter's next decision anything but "wait": while a live waiter is
// queued ahead of it, any change that leaves it so and names no new holder
// of its own session; once it is first, a change that leaves the holder the
// same session in the same state (its renewals aside) and it still queued
// first. Deciding again on every change made each of n waiters read the
// lock on each of the others' heartbeats and on each of the holder's
// writes: their clients' request budgets ran dry, and the one whose turn
// came then took seconds to take the lock, or starved its renewals until
// it lost it (20 contending clients, issue 13).
//
// It only ever spares a read while waiting, never decides: a change it lets
// pass is read anyway when the waiter's own heartbeat, the holder's expiry
// or an entry ahead's expiry, as last read, falls due (nextDecision), and
// every take is judged on a fresh read. So it errs towards false (decide
// again) on whatever it does not recognise: another kind of event or
// object, a deletion, an unreadable record or beat, self missing from the
// queue.
//
// The store reads the event (Store.Change): a Lease store's carries the
// Lease itself; a release store's the beat object or one of the release's
// records. now is the server time as estimated (zero when unknown: every
// entry is then taken for live).
func (v *watchView) quiet(store Store, ev watch.Event, now servertime.Bounds, margin time.Duration) bool {
	if v.seen == nil {
		return false
	}
	c, ok := store.Change(v.seen, ev)
	if !ok {
		return false
	}
	if c.Queued {
		v.queue = c.Queue
	}
	if slices.Contains(c.Holders, v.self) {
		return false // our own take committing late: adopt it (attempt)
	}
	live := liveWaiters(v.queue, now, margin)
	i := slices.IndexFunc(live, func(w Waiter) bool { return w.Session == v.self })
	switch {
	case i < 0:
		return false // dropped from the queue: queue again
	case i > 0 && slices.ContainsFunc(live[:i], func(w Waiter) bool { return v.wasAhead[w.Session] }):
		return true // someone live comes first whatever happens to the lock
	case !v.seenLive:
		return false // only the queue held us back: now first
	}
	// First in the queue: quiet only when the lock is as it was.
	return c.Same
}
