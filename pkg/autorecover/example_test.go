package autorecover_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// upgradeUnderLock is the whole contract around one helm upgrade: lock,
// recover what a dead holder left, renew while running, fence every release
// write, release. The examples call it, and TestIntegrationExampleUpgrade
// runs it against a real API server.
func upgradeUnderLock(ctx context.Context, restConfig *rest.Config, getter genericclioptions.RESTClientGetter,
	namespace, release string, chrt *chart.Chart, values map[string]any,
) error {
	client, err := autorecover.NewClient(restConfig)
	if err != nil {
		return err
	}
	lk, err := client.Acquire(ctx, autorecover.LockRequest{
		Release:   release,
		Namespace: namespace,
		Operation: autorecover.OpUpgrade,
		Timeout:   5 * time.Minute,
		Wait:      2 * time.Minute, // queue behind a live holder for up to 2 minutes
	})
	if err != nil {
		return err // a *autorecover.LockedError names the holder
	}
	defer func() {
		// Give the lock back even when ctx was cancelled.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = lk.Release(rctx)
	}()

	// Renew while the upgrade runs; stop the upgrade if the lock is lost.
	opCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go lk.Keep(opCtx, stop)

	// A revision a dead holder left pending is marked failed at once.
	d, err := lk.Recover(ctx, autorecover.Policy{LegacyAfter: autorecover.DefaultLegacyAfter})
	if err != nil {
		return err
	}
	if d.Verdict == autorecover.VerdictBlocked {
		return errors.New(d.Reason)
	}

	cfg := action.NewConfiguration()
	if err := cfg.Init(getter, namespace, "secret"); err != nil {
		return err
	}
	if err := autorecover.FencedStorage(cfg, lk); err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = namespace
	up.WaitStrategy = kube.StatusWatcherStrategy
	up.Timeout = 5 * time.Minute
	if _, err := up.RunWithContext(opCtx, release, chrt, values); err != nil {
		if cause := context.Cause(opCtx); errors.Is(cause, autorecover.ErrLost) {
			return fmt.Errorf("%w (upgrade stopped: %w)", cause, err)
		}
		return err
	}
	return nil
}

func ExampleClient_Acquire() {
	kubeconfig := os.Getenv("KUBECONFIG")
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Println(err)
		return
	}
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig = &kubeconfig
	chrt, err := loader.Load("./charts/web")
	if err != nil {
		fmt.Println(err)
		return
	}

	err = upgradeUnderLock(context.Background(), restConfig, getter, "shop", "web", chrt, map[string]any{"replicas": 3})
	if locked, ok := errors.AsType[*autorecover.LockedError](err); ok {
		fmt.Printf("busy: %s holds web until %s\n", locked.HolderSession, locked.LockedTill)
		return
	}
	if err != nil {
		fmt.Println("upgrade failed:", err)
	}
}

func ExampleClient_Inspect() {
	restConfig, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Println(err)
		return
	}
	client, err := autorecover.NewClient(restConfig)
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := client.Inspect(context.Background(), "shop", "web")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("lock %s", st.State)
	if st.State != autorecover.LockFree && st.Holder != nil {
		fmt.Printf(", SESSION ID %s, LOCKED TILL %s", st.HolderSession, st.LockedTill.Format(time.RFC3339))
	}
	fmt.Printf("; revision %d is %s (pending: %t)\n", st.LatestRevision, st.LatestStatus, st.Pending)
}

func ExampleClient_Recover() {
	restConfig, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Println(err)
		return
	}
	client, err := autorecover.NewClient(restConfig)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	policy := autorecover.Policy{LegacyAfter: 30 * time.Minute}

	// Look first: no lock taken, nothing written.
	policy.DryRun = true
	d, err := client.Recover(ctx, "shop", "web", policy)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Verdict, d.Reason)
	if d.Verdict != autorecover.VerdictRecover {
		return
	}

	policy.DryRun = false
	d, err = client.Recover(ctx, "shop", "web", policy)
	if errors.Is(err, autorecover.ErrLocked) {
		fmt.Println("someone is working on it:", err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("marked failed:", d.Marked)
}

// offOnce is a Fence that holds until lose is called.
type offOnce struct{ lost bool }

func (f *offOnce) Valid() error {
	if f.lost {
		return fmt.Errorf("lock on release %q was not renewed in time: %w", "web", autorecover.ErrLost)
	}
	return nil
}

func (f *offOnce) lose() { f.lost = true }

func ExampleNewFencedDriver() {
	secrets := fake.NewClientset().CoreV1().Secrets("shop")
	fence := &offOnce{}
	d, err := autorecover.NewFencedDriver(secrets, fence)
	if err != nil {
		fmt.Println(err)
		return
	}

	rel := &rspb.Release{
		Name: "web", Namespace: "shop", Version: 1,
		Info: &rspb.Info{Status: common.StatusPendingInstall},
	}
	if err := d.Create("sh.helm.release.v1.web.v1", rel); err != nil {
		fmt.Println(err)
		return
	}
	s, _ := secrets.Get(context.Background(), "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	fmt.Println("type:", s.Type)
	for _, k := range []string{"name", "owner", "status", "version"} {
		fmt.Printf("label %s=%s\n", k, s.Labels[k])
	}

	fence.lose()
	rel.Info.Status = common.StatusDeployed
	err = d.Update("sh.helm.release.v1.web.v1", rel)
	fmt.Println("update after the lock was lost refused:", errors.Is(err, autorecover.ErrLost))
	// Output:
	// type: helm.sh/release.v1
	// label name=web
	// label owner=helm
	// label status=pending-install
	// label version=1
	// update after the lock was lost refused: true
}

func ExampleLockedError() {
	err := error(&autorecover.LockedError{
		Release:   "web",
		Namespace: "shop",
		Holder: &autorecover.Holder{
			Session:    "5f0c",
			Operation:  autorecover.OpUpgrade,
			Revision:   7,
			Who:        "ci@runner-12",
			AcquiredAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		},
		HolderSession: "5f0c",
		LockedTill:    time.Date(2026, 3, 1, 12, 4, 15, 0, time.UTC),
		Left:          12 * time.Second,
	})
	fmt.Println(errors.Is(err, autorecover.ErrLocked))
	fmt.Println(err)
	// Output:
	// true
	// release "web" in namespace "shop" is locked by ci@runner-12 (session 5f0c, operation upgrade of revision 7, since 2026-03-01T12:00:00Z), LOCKED TILL 2026-03-01T12:04:15Z (can be taken over in 12s unless renewed)
}
