package protocol

import (
	"context"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

func rollbackFixture(t *testing.T) []runtime.Object {
	r2 := revision(t, 2, common.StatusPendingUpgrade, t0)
	r2.Annotations = map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"rec-session","release":"web","namespace":"shop","abandoned":{"schema":1,"session":"dead","release":"web","namespace":"shop","revision":2}}`}
	return []runtime.Object{revision(t, 1, common.StatusDeployed, t0.Add(-time.Hour)), r2}
}

func rollbackConn(t *testing.T, objs ...runtime.Object) (*Conn, *fake.Clientset) {
	client := fake.NewClientset(objs...)
	clk := clocktesting.NewFakeClock(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0.Add(time.Minute))
	kube := func() (*recovery.Kube, error) {
		return &recovery.Kube{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Mapper: meta.NewDefaultRESTMapper(nil)}, nil
	}
	return NewConn(client, est, clk, "", kube), client
}

var rollbackPolicy = recovery.Policy{Autorecover: true, Strategy: recovery.StrategyRollback}

// TestNoRollbackBeforeOtherOperations: with --recover-strategy=rollback,
// no helm rollback runs before an uninstall (it would be undone at once,
// and delete what the uninstall keeps) or an install (--replace: helm's
// install would then find a deployed latest revision and refuse the name);
// the outcome says the operation follows instead.
func TestNoRollbackBeforeOtherOperations(t *testing.T) {
	for _, next := range []lock.Operation{lock.OpUninstall, lock.OpInstall} {
		c, _ := rollbackConn(t, rollbackFixture(t)...)
		ran := false
		out, err := c.Recover(context.Background(), Procedure{
			Release: "web", Namespace: "shop", Lock: dead, Policy: rollbackPolicy, Next: next, Writer: &writer{},
			Rollback: func(string, int) error { ran = true; return nil },
		})
		if ran {
			t.Errorf("helm's rollback ran before a helm %s", next)
		}
		if err != nil || len(out.Marked) != 1 || !strings.Contains(out.Said(), string(next)+", the operation requested, follows instead") {
			t.Errorf("before %s: marked %d, err %v, said %q", next, len(out.Marked), err, out.Said())
		}
	}
}

// TestNoRollbackAfterTargetResolvedElsewhere: the target was resolved by
// its writer between the read and the mark (ErrNotPending): recovery reads
// and decides again instead of rolling back what it deployed.
func TestNoRollbackAfterTargetResolvedElsewhere(t *testing.T) {
	c, client := rollbackConn(t, rollbackFixture(t)...)
	deployed := revision(t, 2, common.StatusDeployed, t0)
	client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == deployed.Name {
			return true, deployed, nil
		}
		return false, nil, nil
	})
	ran := false
	out, err := c.Recover(context.Background(), Procedure{
		Release: "web", Namespace: "shop", Lock: dead, Policy: rollbackPolicy, Next: lock.OpRecover, Writer: &writer{},
		Rollback: func(string, int) error { ran = true; return nil },
	})
	t.Logf("verdict %v marked %d rolledBack %v err %v said %q", out.Decision.Verdict, len(out.Marked), out.RolledBack, err, out.Said())
	if ran || len(out.Marked) != 0 {
		t.Errorf("rolled back (%v) or marked (%d) a release whose revision 2 was found deployed when marking", ran, len(out.Marked))
	}
}

// TestEmbedderToldNotToRollBack: an embedder runs the rollback itself
// (no Rollback func): before an install the decision it gets says recover,
// not recover-then-rollback, and why.
func TestEmbedderToldNotToRollBack(t *testing.T) {
	c, _ := rollbackConn(t, rollbackFixture(t)...)
	out, err := c.Recover(context.Background(), Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: rollbackPolicy, Next: lock.OpInstall, Writer: &writer{}})
	if err != nil || len(out.Marked) != 1 {
		t.Fatalf("marked %d, err %v", len(out.Marked), err)
	}
	if out.Decision.Verdict != recovery.Recover || out.Decision.RollbackTo != 0 || !strings.Contains(out.Decision.Reason, "not rolled back") {
		t.Errorf("decision %v (rollback to %d): %s; want Recover, no rollback, and why", out.Decision.Verdict, out.Decision.RollbackTo, out.Decision.Reason)
	}
}
