package lock

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestQueueKeepsAWaiterWhoseDateRunsBehind: a waiter whose Date headers
// run 30 s behind stamps its queue entry 30 s in the past, so that a
// waiter arriving after it finds the entry expired in server time. That
// waiter queues behind it all the same: an entry is dropped from the queue
// only once seen unchanged for its lease, so the first keeps its place in
// arrival order (the simulation, seeds 4160 and 19421: it was dropped at
// every write of the later waiter, queued anew behind it, and waited 30.8 s
// for a lock expired since it queued).
func TestQueueKeepsAWaiterWhoseDateRunsBehind(t *testing.T) {
	w := newWorld(t)
	holder, behind, later := w.dated(0, 0), w.dated(0, -30*time.Second), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := holder.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	queue := func() []string {
		var out []string
		for _, x := range DecodeQueue(w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue]) {
			out = append(out, x.Session)
		}
		return out
	}
	first, second := req(OpUpgrade, 10*time.Second), req(OpUpgrade, 10*time.Second)
	first.Session, second.Session = "behind", "later"
	bctx, stopBehind := context.WithCancel(ctx)
	defer stopBehind()
	waitAsync(bctx, behind, first)
	eventually(t, "the first waiter queued", func() bool { return slices.Contains(queue(), "behind") })
	lctx, stopLater := context.WithCancel(ctx)
	defer stopLater()
	waitAsync(lctx, later, second)
	eventually(t, "the second waiter queued", func() bool { return slices.Contains(queue(), "later") })
	waitTimers(t, later, 1)
	if got := queue(); !slices.Equal(got, []string{"behind", "later"}) {
		t.Fatalf("queue %v, want the waiter that came first first: [behind later]", got)
	}
}
