package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"
)

// TestCarryStopsAfterBeatPastDeadline: a lock taken while the release had
// no record writes its beat before Carry's write (the create of revision 1,
// which carries the lock); when that beat's read is held up past the lock's
// renew deadline, Carry sends nothing more and says the lock is lost
// (found by the review of issue 32's deadline fixes: the create went out).
func TestCarryStopsAfterBeatPastDeadline(t *testing.T) {
	const lease = 15 * time.Second
	w := newRWorld(t)
	ctx := context.Background()
	if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h, _, err := w.b.TryAcquire(ctx, req(OpInstall, lease))
	if err != nil {
		t.Fatal(err)
	}
	if h.snap.Newest != nil {
		t.Fatal("the lock of a release with no record is not virtual")
	}
	stalled := false
	logWrites(w, func(a k8stesting.Action) {
		if a.GetVerb() == "list" && !stalled {
			stalled = true
			w.clk.Step(lease) // the beat's read held up past the deadline
		}
	})
	wrote := false
	err = h.Carry(func(Record) error { wrote = true; return nil })
	if !stalled {
		t.Fatal("the beat was not read")
	}
	if wrote {
		t.Fatal("Carry sent its write after the lock's renew deadline passed")
	}
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Carry = %v, want an error wrapping ErrLost", err)
	}
}
