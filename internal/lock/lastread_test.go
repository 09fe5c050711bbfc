package lock

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTakeReadsOnce: a take of a free record lock reads the newest record's
// metadata and the beat once (the Get), then writes the beat and the gate
// (the gate's full record read for its write): five requests, not a second
// list and beat read before the writes.
func TestTakeReadsOnce(t *testing.T) {
	w := newRWorld(t)
	n := len(w.cs.Actions())
	h, _, err := w.b.TryAcquire(context.Background(), req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var verbs []string
	for _, a := range w.cs.Actions()[n:] {
		verbs = append(verbs, a.GetVerb())
	}
	if len(verbs) != 5 {
		t.Errorf("the take made %d requests %v, want 5 (list, get beat, put beat, get gate, put gate)", len(verbs), verbs)
	}
	gate, err := w.cs.CoreV1().Secrets(ns).Get(context.Background(), "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := DecodeRecord(gate.Annotations[AnnotationRecord])
	if err != nil || rec.Session != h.Session() {
		t.Fatalf("the gate names %+v (%v), want session %s", rec, err, h.Session())
	}
}

// TestTakeFromStaleReadConflicts: what Get read is used by the take that
// follows only while it holds: a beat written in between makes the take's
// beat write conflict, and a gate written in between its gate write; in
// both cases the gate keeps the other writer's record, and a fresh read
// follows.
func TestTakeFromStaleReadConflicts(t *testing.T) {
	for _, c := range []struct {
		name    string
		between func(t *testing.T, w *rworld)
	}{
		{"beat written in between", func(t *testing.T, w *rworld) {
			bt := w.beat(t)
			bt.Annotations["other"] = "x"
			if _, err := w.cs.CoreV1().Secrets(ns).Update(context.Background(), bt, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"gate written in between", func(t *testing.T, w *rworld) {
			g, err := w.cs.CoreV1().Secrets(ns).Get(context.Background(), "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g.Annotations = map[string]string{"other": "x"}
			if _, err := w.cs.CoreV1().Secrets(ns).Update(context.Background(), g, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRWorld(t)
			ctx := context.Background()
			// A first holder takes and releases, so that a beat exists.
			h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			st := w.b.leases(ns).(*releaseStore)
			seen, err := st.Get(ctx, LeaseName("web"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c.between(t, w)
			before, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			r := req(OpUpgrade, 15*time.Second)
			r.Session = "taker"
			now, _ := w.b.time.Now()
			rec := newRecord(&r, now)
			l := seen.DeepCopy()
			if err := setHolder(l, &rec); err != nil {
				t.Fatal(err)
			}
			_, err = st.Update(ctx, l, metav1.UpdateOptions{})
			if !apierrors.IsConflict(err) {
				t.Fatalf("take from a stale read: %v, want a conflict", err)
			}
			after, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			if after.ResourceVersion != before.ResourceVersion {
				t.Errorf("the gate was written from a stale read")
			}
			// The next Update is not served from the stale read: it reads
			// afresh (and conflicts again, on the view it was given).
			n := len(w.cs.Actions())
			_, err = st.Update(ctx, l, metav1.UpdateOptions{})
			if !apierrors.IsConflict(err) {
				t.Fatalf("second take from the stale view: %v, want a conflict", err)
			}
			if w.cs.Actions()[n].GetVerb() != "list" {
				t.Errorf("the second update did not read afresh: %v", w.cs.Actions()[n:])
			}
		})
	}
}
