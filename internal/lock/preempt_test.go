package lock

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestQueueEncodingsCarryPreempt: a waiter's request that the holder stop
// (Waiter.Preempt) survives both forms of the queue, the Lease's JSON
// (AnnotationQueue) and the beat's compact form (the beat's waiters annotation, key
// "p"), both ways, for every entry; an entry that did not ask carries no
// key at all, so the queues of waiters that do not preempt are written
// as before.
func TestQueueEncodingsCarryPreempt(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	w := func(session string, preempt bool) Waiter {
		return Waiter{Session: session, Who: session + "@host", Operation: OpUpgrade, EnqueuedAt: t0, HeartbeatAt: t0.Add(time.Second), ExpiresAt: t0.Add(16 * time.Second), Preempt: preempt}
	}
	for _, tc := range []struct {
		name string
		ws   []Waiter
		// keys: how many entries carry the key in each form.
		keys int
	}{
		{"none asks", []Waiter{w("a", false), w("b", false)}, 0},
		{"the first asks", []Waiter{w("a", true), w("b", false)}, 1},
		{"the last asks", []Waiter{w("a", false), w("b", false), w("c", true)}, 1},
		{"all ask", []Waiter{w("a", true), w("b", true)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, err := EncodeQueue(tc.ws)
			if err != nil {
				t.Fatal(err)
			}
			if got := DecodeQueue(js); !slices.Equal(got, tc.ws) {
				t.Errorf("Lease queue: DecodeQueue(EncodeQueue(ws)) =\n  %+v\nwant\n  %+v", got, tc.ws)
			}
			compact, err := encodeWaiters(tc.ws)
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeWaiters(compact); !slices.Equal(got, tc.ws) {
				t.Errorf("beat queue: decodeWaiters(encodeWaiters(ws)) =\n  %+v\nwant\n  %+v", got, tc.ws)
			}
			// The wire keys, as other versions and readers see them.
			var lease struct {
				Waiters []map[string]any `json:"waiters"`
			}
			var beat []map[string]any
			if err := json.Unmarshal([]byte(js), &lease); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(compact), &beat); err != nil {
				t.Fatal(err)
			}
			if n := countKey(lease.Waiters, "preempt"); n != tc.keys {
				t.Errorf("Lease queue %s: %d entries with key preempt; want %d", js, n, tc.keys)
			}
			if n := countKey(beat, "p"); n != tc.keys {
				t.Errorf("beat queue %s: %d entries with key p; want %d", compact, n, tc.keys)
			}
		})
	}
	// The beat's form as written by hand (or by another process).
	got := decodeWaiters(`[{"s":"a","e":1,"x":2},{"s":"b","e":1,"x":2,"p":true}]`)
	if len(got) != 2 || got[0].Preempt || !got[1].Preempt {
		t.Errorf("decodeWaiters of a written queue = %+v; want b alone asking", got)
	}
}

// countKey counts the entries of ms that carry key, with the value true.
func countKey(ms []map[string]any, key string) int {
	n := 0
	for _, m := range ms {
		if m[key] == true {
			n++
		}
	}
	return n
}

// TestEnqueueKeepsAnotherWaitersPreempt: a waiter's enqueue rewrites the
// whole queue (read, append, conditional write); the request to stop of a
// waiter queued before it must come out of that rewrite unchanged, through
// the Lease's queue and through the beat's (where the release store turns
// the compact form into the Lease's and back). The later waiter, which did
// not ask, asks nothing.
func TestEnqueueKeepsAnotherWaitersPreempt(t *testing.T) {
	for _, backend := range []string{"lease", "release"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC))
			est := servertime.New(clk)
			est.Observe(clk.Now(), clk.Now(), clk.Now())
			var b *Backend
			if backend == "lease" {
				cs, _ := newCASClient()
				b = NewLeaseBackend(cs, est, clk)
			} else {
				cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{
					Name: "sh.helm.release.v1.web.v1", Namespace: ns,
					Labels: map[string]string{"owner": "helm", "name": "web", "version": "1", "status": "deployed"},
				}, Data: map[string][]byte{"release": []byte("x")}})
				b = NewReleaseBackend(cs, est, clk, records.DriverSecret)
			}
			b = fakeClocked(b)
			if _, _, err := b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second)); err != nil {
				t.Fatal(err)
			}
			enqueue := func(session string, preempt bool) {
				t.Helper()
				r := req(OpUpgrade, 15*time.Second)
				r.Session, r.Preempt = session, preempt
				l, err := b.store(ns).Read(ctx, LeaseName("web"))
				if err != nil {
					t.Fatal(err)
				}
				now, err := b.serverNow(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.enqueue(ctx, &r, &waitState{}, b.decode(l, now, session)); err != nil {
					t.Fatalf("enqueue %s: %v", session, err)
				}
			}
			enqueue("asker", true)
			enqueue("later", false)
			l, err := b.store(ns).Read(ctx, LeaseName("web"))
			if err != nil {
				t.Fatal(err)
			}
			q := l.Queue
			if len(q) != 2 || q[0].Session != "asker" || !q[0].Preempt || q[1].Session != "later" || q[1].Preempt {
				t.Fatalf("queue after the later waiter's enqueue = %+v; want asker (asking to preempt), then later (not asking)", q)
			}
		})
	}
}
