package protocol

import (
	"context"
	"errors"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// flooredWriter is a lock whose take wrote the records at resourceVersion rv.
type flooredWriter struct {
	writer
	rv string
}

func (w *flooredWriter) ReadFloor() string { return w.rv }

// historyLists returns the list options of every full list of Secrets.
func historyLists(cs interface{ Actions() []k8stesting.Action }) []metav1.ListOptions {
	var out []metav1.ListOptions
	for _, a := range cs.Actions() {
		if l, ok := a.(k8stesting.ListActionImpl); ok && a.GetResource().Resource == "secrets" {
			out = append(out, l.ListOptions)
		}
	}
	return out
}

// TestFirstReadFromTheTake: the first history read under a lock asks for a
// state not older than the take's own write (served by the API server's
// cache at once); a server that refuses it gets a consistent read, and so
// does every read after the first.
func TestFirstReadFromTheTake(t *testing.T) {
	objs := []runtime.Object{revision(t, 1, common.StatusDeployed, t0.Add(-time.Hour))}
	policy := recovery.Policy{Autorecover: true}

	c, cs := fakeConn(t, objs...)
	out, err := c.Recover(context.Background(), Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: policy, Next: lock.OpUpgrade, Writer: &flooredWriter{rv: "42"}})
	if err != nil || out.Decision.Verdict != recovery.Proceed {
		t.Fatalf("%v, %v", out.Decision.Verdict, err)
	}
	lists := historyLists(cs)
	if len(lists) != 1 || lists[0].ResourceVersion != "42" || lists[0].ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		t.Errorf("history read with %+v, want one list not older than 42", lists)
	}

	c, cs = fakeConn(t, objs...)
	cs.PrependReactor("list", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.ListActionImpl).ListOptions.ResourceVersion != "" {
			return true, nil, errors.New("Timeout: Too large resource version")
		}
		return false, nil, nil
	})
	out, err = c.Recover(context.Background(), Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: policy, Next: lock.OpUpgrade, Writer: &flooredWriter{rv: "42"}})
	if err != nil || out.Decision.Verdict != recovery.Proceed || out.Latest != 1 {
		t.Fatalf("after a refused floored read: %v (latest %d), %v", out.Decision.Verdict, out.Latest, err)
	}
	if lists := historyLists(cs); len(lists) != 2 || lists[1].ResourceVersion != "" {
		t.Errorf("history reads %+v, want the floored one then a consistent one", lists)
	}
}

// TestReleaseReadsFromHelmsLastWrite: the release's first read of the
// records is not older than the last record write the fence reported
// (RecordWritten), so it does not wait for the API server's cache to
// confirm it is current right after helm's final write.
func TestReleaseReadsFromHelmsLastWrite(t *testing.T) {
	l, cs := heldRecordLock(t)
	ctx := context.Background()
	l.RecordWritten(metav1.ObjectMeta{ResourceVersion: "77"})
	cs.ClearActions()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lists := historyLists(cs)
	if len(lists) == 0 || lists[0].ResourceVersion != "77" || lists[0].ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		t.Errorf("the release's reads %+v: want the first not older than 77", lists)
	}
	for _, o := range lists[1:] {
		if o.ResourceVersion != "" {
			t.Errorf("a later read of the release was floored too: %+v", lists)
		}
	}
}

// TestReleaseAfterUnsettledWriteReadsConsistently: when a write of a
// revision of ours ended unsettled (its outcome may be unknown: a create
// whose answer was lost may have committed), the release reads the records
// consistently, so that it finds the newest record wherever it is.
func TestReleaseAfterUnsettledWriteReadsConsistently(t *testing.T) {
	l, cs := heldRecordLock(t)
	ctx := context.Background()
	l.RecordWritten(metav1.ObjectMeta{ResourceVersion: "77"})
	l.OwnRecordWrite(2, false) // its answer was lost
	cs.ClearActions()
	_ = l.Release(ctx)
	for _, o := range historyLists(cs) {
		if o.ResourceVersion != "" {
			t.Errorf("the release read %+v not older than helm's last noted write after an unsettled one", o)
		}
	}
}

// heldRecordLock is a record lock on release shop/web (revision 1
// deployed), taken through a fake clientset.
func heldRecordLock(t *testing.T) (*Lock, *fake.Clientset) {
	t.Helper()
	c, cs := fakeConn(t, revision(t, 1, common.StatusDeployed, t0.Add(-time.Hour)))
	ctx := context.Background()
	l, err := c.Take(ctx, Request{Release: "web", Namespace: "shop", Operation: lock.OpUpgrade, Who: "test", Backend: BackendRelease})
	if err != nil {
		t.Fatal(err)
	}
	return l, cs
}
