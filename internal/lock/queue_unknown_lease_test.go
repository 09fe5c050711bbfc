package lock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDeadWaiterOfUnknownLeaseIsPruned (found by review): an entry whose
// waiter's lease is unknown (HeartbeatAt zero: a beat's entry written by a
// version that kept only its expiry, see compactWaiter) is "judged by
// server time alone" (waiterStopped). judgeWaiters keeps an entry
// expired in server time until this process has seen it unchanged for its
// lease, which such an entry never says: it must go once expired in
// server time, or every take and every queue write carries it for ever. A
// client that has seen it expired for an hour takes the lock and leaves an
// empty queue.
func TestDeadWaiterOfUnknownLeaseIsPruned(t *testing.T) {
	w := newWorld(t)
	a := w.dated(0, 0)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.store.get(ns, LeaseName("web"))
	if err := setQueue(l, []Waiter{{Session: "w1", ExpiresAt: at(10 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	w.store.put(l)
	_, _, err = a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	var le *LockedError
	if !errors.As(err, &le) || le.Ahead != 1 {
		t.Fatalf("TryAcquire with a live waiter ahead = %v", err)
	}
	w.advance(time.Hour)
	if _, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second)); err != nil {
		t.Fatalf("TryAcquire an hour after the waiter expired: %v", err)
	}
	if q := w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue]; q != "" {
		t.Errorf("a waiter expired an hour ago in server time, seen unchanged since, is still queued: %s", q)
	}
}
