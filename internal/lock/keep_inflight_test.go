package lock

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// heldRenewals is a store whose renewals wait for release before they
// commit, and then, as a request whose context ended while it was in
// flight, commit all the same and answer with the context's error.
type heldRenewals struct {
	Store
	sent    chan<- struct{}
	release <-chan struct{}
}

func (h heldRenewals) Renew(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error) {
	h.sent <- struct{}{}
	<-h.release
	out, err := h.Store.Renew(context.WithoutCancel(ctx), from, rec)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return out, err
}

// TestHandOverLetsARenewalInFlightFinish: the renewals of a holder are
// handed over (stopKeeping: Acquire's, once every part is taken)
// while one is in flight. It runs to its answer: the holder knows the
// renewal it made, its renew deadline counted from it, instead of
// forgetting a write that committed and conflicting with it at its next
// write (the simulation, seed 13031: the renewal after it came too late,
// and the lock was lost).
func TestHandOverLetsARenewalInFlightFinish(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := held.Deadline()
	sent, release := make(chan struct{}, 1), make(chan struct{})
	inner := a.b.stores
	a.b.stores = func(ns string) Store {
		return heldRenewals{inner(ns), sent, release}
	}
	kctx, stopKeep := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		held.Keep(kctx, nil)
	}()
	waitTimers(t, a, 1)
	w.advance(time.Second) // the renewal falls due
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal sent a third of the lease after the take")
	}
	stopped, cancelled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		held.stopKeeping(func() { close(cancelled); stopKeep() })
	}()
	// Nothing may cancel the renewal while it is in flight. A negative
	// check needs a window: with stopKeeping right, cancel cannot come
	// before release, however long this waits.
	select {
	case <-cancelled:
		t.Fatal("the renewal in flight was cancelled")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-stopped
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Keep did not end after its context did")
	}
	if after := held.Deadline(); !after.After(before) {
		t.Fatalf("renew deadline %v after the renewal that committed, want later than %v (the take's)", after, before)
	}
	if got, want := held.snap.Version.(*coordinationv1.Lease).ResourceVersion, w.store.get(ns, LeaseName("web")).ResourceVersion; got != want {
		t.Errorf("the holder knows its Lease at resourceVersion %s, the server has %s", got, want)
	}
}
