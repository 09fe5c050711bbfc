package lock

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestWaitTakesWhenTheWaiterAheadLeaves: the Lease is Free (or Expired) and
// a live waiter A is first; self queues behind it. A gives up (its
// --lock-timeout, Ctrl-C: it leaves the queue). Self, now first on a lock
// it may take, takes it at once, without the clock advancing to its next
// heartbeat (review of quiet.go, F1).
func TestWaitTakesWhenTheWaiterAheadLeaves(t *testing.T) {
	for _, expired := range []bool{false, true} {
		name := "free"
		if expired {
			name = "expired"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			a, c := w.backend(0), w.backend(0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if !expired {
				if err := held.Release(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				w.advance(10 * time.Second) // holder dead, lock Expired
			}
			now := t0.Add(w.clients[0].clk.Now().Sub(t0))
			l := w.store.get(ns, LeaseName("web"))
			if err := setQueue(l, []Waiter{{Session: "A", EnqueuedAt: now, ExpiresAt: now.Add(15 * time.Second)}}); err != nil {
				t.Fatal(err)
			}
			w.store.put(l)
			done := make(chan error, 1)
			go func() {
				_, err := c.b.Wait(ctx, req(OpUpgrade, 15*time.Second), nil)
				done <- err
			}()
			eventually(t, "self queued", func() bool {
				return len(DecodeQueue(w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue])) == 2
			})
			waitTimers(t, c, 2)
			// A dequeues (its --lock-timeout, Ctrl-C).
			l = w.store.get(ns, LeaseName("web"))
			q := DecodeQueue(l.Annotations[AnnotationQueue])
			q = slices.DeleteFunc(q, func(x Waiter) bool { return x.Session == "A" })
			_ = setQueue(l, q)
			w.store.put(l)
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				// The fake clock stands still: without a decision on the
				// queue's change, self would wait for ever.
				t.Fatal("self, now first on a free lock, did not take it (stays quiet until its heartbeat timer)")
			}
		})
	}
}

// TestQuietNotWhenTheWaiterAheadLeavesAnExpiredLock: release store, the
// gate's holder expired, A first, self second; A leaves the queue (a beat
// write, queue [self]): not quiet, self may take the lock now.
func TestQuietNotWhenTheWaiterAheadLeavesAnExpiredLock(t *testing.T) {
	f := newReleaseLock(t, t0q.Add(-time.Minute), "A", "self")
	v := (&Backend{Margin: 250 * time.Millisecond, TrustServerTime: true}).decode(f.seen, f.now, "self")
	if v.state != Expired {
		t.Fatalf("the lock read is %v, want expired", v.state)
	}
	if newWatchView(f.seen, "self", v.state == Live).quiet(releaseChanges(), f.beatEvent("self"), f.now, 250*time.Millisecond) {
		t.Error("expired lock, the waiter ahead left: quiet")
	}
}

// TestQuietAfterAStaleBeat: release store, a beat older than the one last
// read, replayed by the watch (it starts from the records list's
// resourceVersion), shows A ahead again; the gate's release, delivered on
// the records' watch before the beat's catches up, is not let pass: only a
// waiter that was ahead at the last read holds self back (F2).
func TestQuietAfterAStaleBeat(t *testing.T) {
	f := newReleaseLock(t, t0q, "self")
	v := newWatchView(f.seen, "self", true)
	_ = v.quiet(releaseChanges(), f.beatEvent("A", "self"), f.now, 0)
	if v.quiet(releaseChanges(), f.gateEvent(true), f.now, 0) {
		t.Error("gate released while first (per seen), after a stale replay: quiet")
	}
}
