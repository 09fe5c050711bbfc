package lock

// Regression tests from the adversarial review of deleting the lock of a
// release with no stored revision (a failed operation on a release that
// does not exist): a waiter that read the Lease before its holder deleted it
// takes the lock instead of failing; a failed first create leaves no beat;
// the delete never removes another client's first revision or lock.

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestDeleteRaceWaiterSurvivesHolderDeletingLease: a waiter (--lock-timeout)
// reads the Lease live, then the holder deletes it (ReleaseAndDelete with no
// live waiter yet queued: now every failed operation on a release with no
// revision does this), then the waiter's enqueue Update answers NotFound.
// The waiter should read again and create the Lease; it fails instead
// (retriable(NotFound) is false), with a non-lock error.
func TestDeleteRaceWaiterSurvivesHolderDeletingLease(t *testing.T) {
	w := newWorld(t)
	a, c := w.backend(0), w.backend(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_ = held
	deleted := false
	w.store.setFail(func(verb string) error {
		if verb == "update" && !deleted {
			// The holder's conditional delete lands between the waiter's
			// read and its enqueue (the holder saw no waiter).
			deleted = true
			delete(w.store.objs, key(ns, LeaseName("web")))
		}
		return nil
	})
	h, err := c.b.Wait(ctx, req(OpInstall, 15*time.Second), nil)
	if err != nil {
		t.Fatalf("waiter failed after the holder deleted its Lease (NotFound=%v): %v", apierrors.IsNotFound(err), err)
	}
	if h == nil {
		t.Fatal("no lock")
	}
}

func reviewReleaseBackend(t *testing.T, objs ...*corev1.Secret) (*fake.Clientset, *Backend) {
	t.Helper()
	cs := fake.NewClientset()
	// The stock fake assigns no resourceVersion; the API server does.
	rv := 100
	cs.PrependReactor("*", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "create" || a.GetVerb() == "update" {
			if o, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok {
				rv++
				o.SetResourceVersion(strconv.Itoa(rv))
			}
		}
		return false, nil, nil
	})
	for _, o := range objs {
		if _, err := cs.CoreV1().Secrets(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	clk := clock.RealClock{}
	est := servertime.New(clk)
	now := clk.Now()
	est.Observe(now, now, now.Truncate(time.Second))
	return cs, fakeClocked(NewReleaseBackend(cs, est, clk, records.DriverSecret))
}

// TestDeleteRaceFailedFirstCreateLeavesNoBeat: an install takes the (virtual)
// record lock of a release with no revision; the fence's Carry writes the
// beat just before helm's create of revision 1, and the create fails (too
// large, an admission webhook, a quota). The release still has no revision,
// so the guard now calls ReleaseAndDelete to leave nothing behind; the beat
// written by Carry stays, because the virtual lock's snapshot names no
// beat (Create sets its beat resourceVersion to "").
func TestDeleteRaceFailedFirstCreateLeavesNoBeat(t *testing.T) {
	cs, b := reviewReleaseBackend(t)
	ctx := context.Background()
	held, _, err := b.TryAcquire(ctx, req(OpInstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	errCreate := errors.New("Secret is invalid: data: Too long")
	if err := held.Carry(func(Record) error { return errCreate }); !errors.Is(err, errCreate) {
		t.Fatalf("Carry = %v", err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, LeaseName("web"), metav1.GetOptions{}); err != nil {
		t.Fatalf("Carry wrote no beat (premise): %v", err)
	}
	err = held.ReleaseAndDelete(ctx)
	t.Logf("ReleaseAndDelete = %v", err)
	if s, err := cs.CoreV1().Secrets(ns).Get(ctx, LeaseName("web"), metav1.GetOptions{}); err == nil {
		t.Fatalf("beat left behind for a release with no revision: %v", s.Annotations)
	}
}

// TestDeleteRaceDeleteSparesAnotherClientsFirstRevision: the check found safe.
// A (no revision when it took the virtual lock) deletes its lock after a
// failed operation; meanwhile B created revision 1 carrying its gate and
// wrote its beat. A's delete must touch neither.
func TestDeleteRaceDeleteSparesAnotherClientsFirstRevision(t *testing.T) {
	cs, b := reviewReleaseBackend(t)
	ctx := context.Background()
	heldA, _, err := b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// B's first install: the beat, then revision 1 with B's gate.
	now := time.Now().UTC().Truncate(time.Millisecond)
	recB := Record{
		Schema: SchemaVersion, Session: "B", Operation: OpInstall, Release: "web", Namespace: ns,
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: now, RenewedAt: now, LockedTill: now.Add(15 * time.Second), MaxHoldUntil: now.Add(time.Hour),
	}
	// B's take wrote nothing (the release had no record); its fence
	// announces it on the beat before the first record (Store.Announce).
	st := Stores.ReleaseStore(cs, records.DriverSecret, ns)
	if _, err := st.Read(ctx, LeaseName("web")); !apierrors.IsNotFound(err) {
		t.Fatalf("read of a release with no record: %v; want NotFound", err)
	}
	seen, err := st.Create(ctx, LeaseName("web"), recB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Announce(ctx, seen, recB); err != nil {
		t.Fatal(err)
	}
	gf := gateForm(recB)
	gate, _ := gf.Encode()
	rev1 := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: "sh.helm.release.v1.web.v1", Namespace: ns,
		Labels:      map[string]string{"owner": "helm", "name": "web", "version": "1", "status": "pending-install"},
		Annotations: map[string]string{AnnotationRecord: gate},
	}, Data: map[string][]byte{"release": []byte("x")}}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, rev1, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = heldA.ReleaseAndDelete(ctx)
	if !errors.Is(err, ErrLost) {
		t.Errorf("A's ReleaseAndDelete = %v, want ErrLost (B holds the release)", err)
	}
	got, err := cs.CoreV1().Secrets(ns).Get(ctx, rev1.Name, metav1.GetOptions{})
	if err != nil || got.Annotations[AnnotationRecord] != gate {
		t.Fatalf("B's gate touched: %v %v", err, got.Annotations)
	}
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, LeaseName("web"), metav1.GetOptions{}); err != nil {
		t.Fatalf("B's beat deleted: %v", err)
	}
}
