package lock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// retakeWorld: a release with no record (part 0 virtual) and a CAS Lease
// store on the same fake clientset; after is called once, right after the
// first successful write of the Lease (Acquire's take of part 1).
func retakeWorld(t *testing.T, after func(w *rworld, leases *casLeases)) (*rworld, *casLeases, *Backend) {
	w := newRWorld(t)
	ctx := context.Background()
	if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := &casLeases{objs: map[string]*coordinationv1.Lease{}, calls: map[string]int{}}
	var once sync.Once
	w.cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := leases.react(a)
		if err == nil && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			once.Do(func() { after(w, leases) })
		}
		return handled, obj, err
	})
	est := servertime.New(w.clk)
	est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
	lb := fakeClocked(NewLeaseBackend(w.cs, est, w.clk))
	lb.Margin = time.Second
	return w, leases, lb
}

// installStock creates revision 1 as stock helm does (no lock on it): a
// virtual record lock taken before it is lost (gone).
func installStock(w *rworld) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.rv++
	o := recSecret(1, "deployed", nil)
	o.ResourceVersion = strconv.Itoa(w.s.rv)
	w.s.objs[o.Name] = o
}

// TestJointRetakeAfterTheLeaseWasDeleted: the record lock is lost (the
// release got installed) and the Lease was deleted (by hand, or force
// released) before the confirmation: there is no Lease to give back, and
// both parts are taken again in order (review of the in-order retake, F1).
func TestJointRetakeAfterTheLeaseWasDeleted(t *testing.T) {
	w, _, lb := retakeWorld(t, func(w *rworld, leases *casLeases) {
		installStock(w)
		leases.mu.Lock()
		delete(leases.objs, key(ns, LeaseName("web")))
		leases.mu.Unlock()
	})
	j, err := Acquire(context.Background(), req(OpInstall, 15*time.Second), false, nil, w.b, lb)
	if err != nil {
		t.Fatalf("Acquire failed instead of taking both parts again in order: %v (ErrLost: %v)", err, errors.Is(err, ErrLost))
	}
	_ = j.Release(context.Background())
}

// TestJointRetakeKeepsExpiredLeaseHolder: a Lease taken over from an
// expired holder X, given back because the record lock was lost, and taken
// again still names X (Held.Previous), so what X abandoned is recovered.
func TestJointRetakeKeepsExpiredLeaseHolder(t *testing.T) {
	w, leases, lb := retakeWorld(t, func(w *rworld, _ *casLeases) { installStock(w) })
	x := Record{
		Schema: SchemaVersion, Session: "X", Operation: OpUpgrade, Release: "web", Namespace: ns, Revision: 7,
		RenewedAt: t0.Add(-time.Hour), AcquiredAt: t0.Add(-time.Hour), LockedTill: t0.Add(-time.Hour + 15*time.Second),
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: ns, Labels: LockLabels("web")}}
	if err := setHolder(l, &x); err != nil {
		t.Fatal(err)
	}
	leases.put(l)
	j, err := Acquire(context.Background(), req(OpUpgrade, 15*time.Second), false, nil, w.b, lb)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = j.Release(context.Background()) }()
	if j.parts[0].isVirtual() {
		t.Fatalf("part 0 still virtual: the retake did not happen")
	}
	rec, st := j.Previous()
	if st != Expired || rec == nil || rec.Session != "X" || rec.Revision != 7 {
		t.Errorf("after give-back and retake, Held.Previous = %+v %v; want X's revision 7, Expired", rec, st)
	}
}

// acquireWhileRecordsMove takes a record lock and then the Lease, while
// the record lock is lost losses times: the release has no record (the
// record lock is virtual), each Lease take installs a stock revision 1
// (the record lock is lost), and each Lease give-back deletes it again (the
// record lock's retake is virtual once more). It returns the Lease takes
// made and Acquire's error.
func acquireWhileRecordsMove(t *testing.T, losses int) (int, error) {
	t.Helper()
	w := newRWorld(t)
	ctx := context.Background()
	w.s.mu.Lock()
	delete(w.s.objs, "sh.helm.release.v1.web.v1")
	w.s.mu.Unlock()
	leases := &casLeases{objs: map[string]*coordinationv1.Lease{}, calls: map[string]int{}}
	lost, takes := 0, 0
	w.cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := leases.react(a)
		if err != nil || (a.GetVerb() != "create" && a.GetVerb() != "update") {
			return handled, obj, err
		}
		l := obj.(*coordinationv1.Lease)
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			takes++
			if lost < losses {
				lost++
				installStock(w)
			}
		} else {
			w.s.mu.Lock()
			delete(w.s.objs, "sh.helm.release.v1.web.v1")
			w.s.mu.Unlock()
		}
		return handled, obj, err
	})
	est := servertime.New(w.clk)
	est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
	lb := fakeClocked(NewLeaseBackend(w.cs, est, w.clk))
	lb.Margin = time.Second
	h, err := Acquire(ctx, req(OpInstall, 15*time.Second), false, nil, w.b, lb)
	if h != nil {
		if err := h.Release(ctx); err != nil {
			t.Errorf("release: %v", err)
		}
	}
	return takes, err
}

// TestAcquireConfirmsItsLastRetake: a part lost while a later one was
// taken is taken again up to maxRetakes times, and the last retake is
// confirmed like the others (found by review: the loop before it gave up
// after its fifth retake without checking it); one loss more fails with
// "kept moving", every part given back.
func TestAcquireConfirmsItsLastRetake(t *testing.T) {
	for _, losses := range []int{1, maxRetakes} {
		if takes, err := acquireWhileRecordsMove(t, losses); err != nil {
			t.Errorf("%d losses: %v after %d Lease takes, want the lock", losses, err, takes)
		} else if takes != losses+1 {
			t.Errorf("%d losses: %d Lease takes, want %d", losses, takes, losses+1)
		}
	}
	if _, err := acquireWhileRecordsMove(t, maxRetakes+1); err == nil || !strings.Contains(err.Error(), "kept moving") {
		t.Errorf("%d losses: %v, want the lock kept moving", maxRetakes+1, err)
	}
}
