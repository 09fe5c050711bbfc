package lock

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
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
				return len(decodeQueue(w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue])) == 2
			})
			waitTimers(t, c, 2)
			// A dequeues (its --lock-timeout, Ctrl-C).
			l = w.store.get(ns, LeaseName("web"))
			q := decodeQueue(l.Annotations[AnnotationQueue])
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
	now := servertime.Bounds{Earliest: t0, Latest: t0.Add(50 * time.Millisecond)}
	lease := 15 * time.Second
	old := t0.Add(-time.Minute)
	r := Record{Schema: SchemaVersion, Session: "holder", Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: old, RenewedAt: old, LockedTill: old.Add(lease)}
	g := gateForm(r)
	gateRec, _ := g.Encode()
	b, _ := encodeBeat(r)
	ws := func(s ...string) string {
		var out []Waiter
		for _, x := range s {
			out = append(out, Waiter{Session: x, ExpiresAt: t0.Add(lease)})
		}
		q, _ := encodeWaiters(out)
		return q
	}
	gate := metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", Labels: map[string]string{records.LabelVersion: "3"}, Annotations: map[string]string{AnnotationRecord: gateRec}}
	beat := metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{AnnotationBeat: b, annotationClaimedFrom: "holder", AnnotationWaiters: ws("A", "self")}}
	seen := (&releaseStore{}).virtual("web", records.Record{Kind: records.KindSecret, Meta: gate}, beatObj{meta: beat, exists: true}, "100")
	be := &Backend{Margin: 250 * time.Millisecond}
	v := be.decode(seen, now, "self")
	if v.state != Expired {
		t.Fatalf("the lock read is %v, want expired", v.state)
	}
	left := beat.DeepCopy()
	left.Annotations[AnnotationWaiters] = ws("self")
	if newWatchView(seen, "self", v.state == Live).quiet(StoreRelease, watch.Event{Type: watch.Modified, Object: &corev1.Secret{ObjectMeta: *left}}, now, 250*time.Millisecond) {
		t.Error("expired lock, the waiter ahead left: quiet")
	}
}

// TestQuietAfterAStaleBeat: release store, a beat older than the one last
// read, replayed by the watch (it starts from the records list's
// resourceVersion), shows A ahead again; the gate's release, delivered on
// the records' watch before the beat's catches up, is not let pass: only a
// waiter that was ahead at the last read holds self back (F2).
func TestQuietAfterAStaleBeat(t *testing.T) {
	now := servertime.Bounds{Earliest: t0, Latest: t0.Add(50 * time.Millisecond)}
	lease := 15 * time.Second
	r := Record{Schema: SchemaVersion, Session: "holder", Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(lease)}
	gf := gateForm(r)
	gateRec, _ := gf.Encode()
	b, _ := encodeBeat(r)
	ws := func(s ...string) string {
		var out []Waiter
		for _, x := range s {
			out = append(out, Waiter{Session: x, ExpiresAt: t0.Add(lease)})
		}
		q, _ := encodeWaiters(out)
		return q
	}
	gate := metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", Labels: map[string]string{records.LabelVersion: "3"}, Annotations: map[string]string{AnnotationRecord: gateRec}}
	beat := metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{AnnotationBeat: b, annotationClaimedFrom: "holder", AnnotationWaiters: ws("self")}}
	seen := (&releaseStore{}).virtual("web", records.Record{Kind: records.KindSecret, Meta: gate}, beatObj{meta: beat, exists: true}, "100")
	v := newWatchView(seen, "self", true)
	stale := beat.DeepCopy()
	stale.Annotations[AnnotationWaiters] = ws("A", "self")
	_ = v.quiet(StoreRelease, watch.Event{Type: watch.Modified, Object: &corev1.Secret{ObjectMeta: *stale}}, now, 0)
	r.ReleasedAt = t0
	gr := gateForm(r)
	rel, _ := gr.Encode()
	g2 := gate.DeepCopy()
	g2.Annotations[AnnotationRecord] = rel
	if v.quiet(StoreRelease, watch.Event{Type: watch.Modified, Object: &corev1.Secret{ObjectMeta: *g2}}, now, 0) {
		t.Error("gate released while first (per seen), after a stale replay: quiet")
	}
}
