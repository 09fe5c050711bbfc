package lock

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestVirtualRenewalRenewsItsBeat: a lock taken while the release had no
// record (virtual) writes its beat just before the create of revision 1
// (Carry). Until that create lands, everybody else judges the lock by that
// beat: a renewal renews it there, so that the LOCKED TILL they read moves
// with the holder's renew deadline (the simulation, seed 13466: renewals
// that wrote nothing moved the deadline on, and helm's create, retried
// after a 429, went out after the beat's LOCKED TILL less the margin).
func TestVirtualRenewalRenewsItsBeat(t *testing.T) {
	const lease = 3 * time.Second
	w := newRWorld(t)
	ctx := context.Background()
	if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h, _, err := w.b.TryAcquire(ctx, req(OpInstall, lease))
	if err != nil {
		t.Fatal(err)
	}
	// The beat is written; the create that follows fails (a 429, say),
	// and helm will send it again.
	if err := h.Carry(func(Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	beat := func() *Record {
		s, err := w.cs.CoreV1().Secrets(ns).Get(ctx, LeaseName("web"), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the beat: %v", err)
		}
		r := decodeBeat(s.Annotations[Stores.AnnotationBeat], "web", ns)
		if r == nil {
			t.Fatal("the beat names no holder")
		}
		return r
	}
	before := beat()
	w.clk.Step(lease / 3)
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	after := beat()
	if !after.LockedTill.After(before.LockedTill) {
		t.Fatalf("LOCKED TILL on the beat %v after a renewal, want later than %v", after.LockedTill, before.LockedTill)
	}
	if want := h.Record().LockedTill; !after.LockedTill.Equal(want) {
		t.Errorf("LOCKED TILL on the beat %v, the holder's %v", after.LockedTill, want)
	}
}
