package protocol

// Findings of the second adversarial review of preemption (issue 34),
// kept as regression tests: each failed at 75e0cfb.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestIntegrationRecoveryRollbackKeepsOpPreemptible: with
// --recover-strategy=rollback, the recovery's helm rollback runs under the
// operation's own lock, through the same write fence as helm's operation
// (the CLI's lockRollback uses helm's getter, fenced by DefaultWriteFence;
// pkg/autorecover's Run its ActionConfig). Its create of a revision
// pending-rollback sets the fence's phase "undoing" for good (until the
// next Guard), so the install or upgrade that follows it, under the same
// lock, must not decline every request to stop ("helm is rolling the
// release back") when no rollback runs any more: the phase starts afresh
// with the operation (runOp), not only with the lock (Guard).
func TestIntegrationRecoveryRollbackKeepsOpPreemptible(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns) // revision 1 deployed
	ctx := context.Background()
	c := settleConn(t, env.Config)
	fence := &helmx.WriteFence{}
	l, err := c.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: 15 * time.Second, Backend: BackendRelease, Fence: fence})
	if err != nil {
		t.Fatal(err)
	}
	// JSON here; helm's own clients send protobuf, which the fence reads
	// too (TestIntegrationFenceReadsHelmsRecordWrites).
	jsonCfg := rest.CopyConfig(env.Config)
	jsonCfg.ContentType = "application/json"
	cs, err := kubernetes.NewForConfig(fence.Wrap(jsonCfg))
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	// What the recovery's helm rollback writes under this lock, through
	// the fence (as Procedure.Rollback does inside Recover): revision 2
	// created pending-rollback, then deployed, revision 1 superseded.
	if err := d.Create(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusPendingRollback)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(helmx.ReleaseSecretName("web", 1), settleRelease(ns, 1, common.StatusSuperseded)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusDeployed)); err != nil {
		t.Fatal(err)
	}

	if why, _ := fence.Busy(); !strings.Contains(why, "rolling the release back") {
		t.Fatalf("after the rollback's create, Busy = %q; want rolling back (the probe's premise)", why)
	}
	var mu sync.Mutex
	var declined []string
	var preempted *PreemptedError
	opStarted := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- l.Run(ctx, Guarded{
			Procedure:   Procedure{Policy: settlePolicy, Next: lock.OpUpgrade},
			Preemptible: true,
			Op: func(ctx context.Context) error {
				// helm's upgrade: revision 3 pending-upgrade, then a
				// long --wait (no write).
				if err := d.Create(helmx.ReleaseSecretName("web", 3), settleRelease(ns, 3, common.StatusPendingUpgrade)); err != nil {
					return err
				}
				close(opStarted)
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(25 * time.Second):
					return errors.New("the --wait ran out: never preempted")
				}
			},
			Preempted: func(p *PreemptedError) {
				mu.Lock()
				preempted = p
				mu.Unlock()
			},
			Declined: func(_ Waiter, why string) {
				mu.Lock()
				declined = append(declined, why)
				mu.Unlock()
			},
		})
	}()
	select {
	case <-opStarted:
	case err := <-runErr:
		t.Fatalf("the operation did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the operation did not start")
	}
	// A second client asks the holder to stop.
	c2 := settleConn(t, env.Config)
	l2, werr := c2.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: 15 * time.Second, Backend: BackendRelease, Preempt: true, Wait: 40 * time.Second})
	if werr == nil {
		_ = l2.Release(ctx)
	}
	err = <-runErr
	mu.Lock()
	defer mu.Unlock()
	for _, why := range declined {
		if strings.Contains(why, "rolling the release back") {
			t.Errorf("the upgrade declined the request: %q; the rollback had ended before it started (recovery's rollback, under the same fence)", why)
		}
	}
	if preempted == nil || !errors.Is(err, ErrPreempted) {
		t.Errorf("the upgrade was not preempted: Run = %v; declined %q", err, declined)
	}
	if werr != nil {
		t.Errorf("the preemptor's take: %v", werr)
	}
}

// TestIntegrationFenceReadsHelmsRecordWrites: helm's storage driver
// writes its records through client-go's generated clientset, which sends
// built-in kinds (Secrets, ConfigMaps) as protobuf unless the
// configuration names a content type (helm's does not). The fence's phase
// must read those bodies: helm's rollback starting (a revision created
// pending-rollback) and its uninstall (a revision written uninstalling)
// make helm busy, so that an upgrade --rollback-on-failure in its
// rollback, or an install --rollback-on-failure in its uninstall, is not
// stopped half-way at a waiter's request.
func TestIntegrationFenceReadsHelmsRecordWrites(t *testing.T) {
	env := testenv.Get(t)
	for _, tc := range []struct {
		name  string
		write func(d *driver.Secrets, ns string) error
		want  string
	}{
		{"a revision created pending-rollback", func(d *driver.Secrets, ns string) error {
			return d.Create(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusPendingRollback))
		}, "rolling the release back"},
		{"a revision written uninstalling", func(d *driver.Secrets, ns string) error {
			return d.Update(helmx.ReleaseSecretName("web", 1), settleRelease(ns, 1, common.StatusUninstalling))
		}, "uninstalling the release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			settleInstall(t, env, ns)
			ctx := context.Background()
			c := settleConn(t, env.Config)
			fence := &helmx.WriteFence{}
			l, err := c.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: 15 * time.Second, Backend: BackendRelease, Fence: fence})
			if err != nil {
				t.Fatal(err)
			}
			defer l.End(ctx, Guarded{}, nil)
			// As helm builds its clients: no content type set.
			cs, err := kubernetes.NewForConfig(fence.Wrap(env.Config))
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.write(driver.NewSecrets(cs.CoreV1().Secrets(ns)), ns); err != nil {
				t.Fatal(err)
			}
			if why, _ := fence.Busy(); !strings.Contains(why, tc.want) {
				t.Errorf("after helm's write, Busy = %q; want it to say helm is %s", why, tc.want)
			}
		})
	}
}
