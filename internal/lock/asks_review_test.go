package lock

// Findings of the adversarial review of preemption's core (issue 34), kept
// as regression tests: each failed at 9eee41b.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestHeartbeatRestoresPreemptMark (review finding F7): a
// waiter of an earlier version (no Waiter.Preempt) that rewrites the queue
// for its own heartbeat drops the mark of a --preempt waiter queued beside
// it (unknown JSON fields, the beat's "p", are not kept). The preemptor's
// own heartbeats must write it again (and a dropped mark makes the
// heartbeat due), or the request is lost for good: the holder never stops
// and the preemptor waits to --lock-timeout.
func TestHeartbeatRestoresPreemptMark(t *testing.T) {
	w := newWorld(t)
	c := w.backend(0)
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: ns, Annotations: map[string]string{}}}
	// The queue as an earlier version rewrote it: b's mark is gone.
	dropped := []Waiter{{Session: "b", Who: "ci@runner", Operation: OpUpgrade, EnqueuedAt: t0, HeartbeatAt: t0, ExpiresAt: t0.Add(30 * time.Second)}}
	if err := setQueue(l, dropped); err != nil {
		t.Fatal(err)
	}
	l = w.store.put(l)
	r := req(OpUpgrade, 30*time.Second)
	r.Session, r.Preempt = "b", true
	got, err := c.b.enqueue(context.Background(), &r, &waitState{}, view{snap: leaseSnapshot(l), live: dropped})
	if err != nil {
		t.Fatal(err)
	}
	q := got.Queue
	if len(q) != 1 || !q[0].Preempt {
		t.Fatalf("after the --preempt waiter's heartbeat its entry reads %+v; want Preempt set again", q)
	}
}

// TestWatchAsksBacksOffWatchesThatCloseAtOnce (review finding F8): a watch that the server (or a proxy in front of it) opens and ends
// at once is opened again at once, without limit, for the whole of the
// operation: a request storm from every holder in --wait. Backend.Wait
// waits before it watches again (wait.go); WatchAsks should too (askPoll).
func TestWatchAsksBacksOffWatchesThatCloseAtOnce(t *testing.T) {
	cs := fake.NewClientset()
	var watches atomic.Int64
	cs.PrependWatchReactor("leases", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches.Add(1)
		fw := watch.NewFake()
		fw.Stop() // ends at once
		return true, fw, nil
	})
	cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: ns}}, nil
	})
	clk := clocktesting.NewFakeClock(t0) // stands still: no poll interval passes
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0)
	b := NewLeaseBackend(cs, est, clk)
	h := &part{b: b, req: Request{Release: "web", Namespace: ns, Session: "a"}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	h.WatchAsks(ctx, func(Waiter) {})
	if n := watches.Load(); n > 5 {
		t.Fatalf("WatchAsks opened %d watches in 200 ms while the clock stood still; want a pause (askPoll) between watches that end at once", n)
	}
}
