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
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// upgradeWithRun is the whole protocol around one helm upgrade, with
// Client.Run: take the lock (queueing behind a live holder), recover what a
// dead holder left, renew while the upgrade runs, fence every write, and
// release. ExampleClient_Run calls it, and TestIntegrationExampleUpgrade
// runs it against a real API server.
func upgradeWithRun(ctx context.Context, restConfig *rest.Config, namespace, release string, chrt *chart.Chart, values map[string]any) error {
	client, err := autorecover.NewClient(restConfig)
	if err != nil {
		return err
	}
	return client.Run(ctx, autorecover.RunConfig{
		Lock: autorecover.LockRequest{
			Release:   release,
			Namespace: namespace,
			Operation: autorecover.OpUpgrade,
			Timeout:   5 * time.Minute,
			Wait:      2 * time.Minute, // queue behind a live holder for up to 2 minutes
		},
		Policy: autorecover.Policy{LegacyAfter: autorecover.DefaultLegacyAfter},
	}, func(ctx context.Context, cfg *action.Configuration) error {
		// cfg fences every request through the lock; ctx ends when the lock
		// is lost, and helm then marks its revision failed (if it still may).
		up := action.NewUpgrade(cfg)
		up.Namespace = namespace
		up.WaitStrategy = kube.StatusWatcherStrategy
		up.Timeout = 5 * time.Minute
		_, err := up.RunWithContext(ctx, release, chrt, values)
		return err
	})
}

// upgradeStepByStep is what Run does, step by step, for callers that drive
// the contract themselves: lock, renew beside the operation, recover what a
// dead holder left, run helm with the lock's fenced configuration, release.
// ExampleClient_Acquire calls it, and TestIntegrationExampleUpgrade runs it
// against a real API server.
func upgradeStepByStep(ctx context.Context, restConfig *rest.Config, namespace, release string, chrt *chart.Chart, values map[string]any) error {
	client, err := autorecover.NewClient(restConfig)
	if err != nil {
		return err
	}
	lk, err := client.Acquire(ctx, autorecover.LockRequest{
		Release:   release,
		Namespace: namespace,
		Operation: autorecover.OpUpgrade,
		Timeout:   5 * time.Minute,
		Wait:      2 * time.Minute,
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

	// Renew from now on (recovery can take a while); stop the operation if
	// the lock is lost.
	opCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go lk.Keep(opCtx, stop)

	// A revision a dead holder left pending is recovered at once.
	d, err := lk.Recover(opCtx, autorecover.Policy{LegacyAfter: autorecover.DefaultLegacyAfter})
	if err != nil {
		return err
	}
	if d.Verdict == autorecover.VerdictBlocked {
		return errors.New(d.Reason)
	}

	// Every request of this configuration goes through the lock's fence.
	cfg, err := lk.ActionConfig()
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = namespace
	up.WaitStrategy = kube.StatusWatcherStrategy
	up.Timeout = 5 * time.Minute
	if _, err := up.RunWithContext(opCtx, release, chrt, values); err != nil {
		if cause := context.Cause(opCtx); errors.Is(cause, autorecover.ErrLost) || errors.Is(cause, autorecover.ErrMaxHold) {
			return fmt.Errorf("%w (upgrade stopped: %w)", cause, err)
		}
		return err
	}
	return nil
}

func ExampleClient_Run() {
	restConfig, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Println(err)
		return
	}
	chrt, err := loader.Load("./charts/web")
	if err != nil {
		fmt.Println(err)
		return
	}

	err = upgradeWithRun(context.Background(), restConfig, "shop", "web", chrt, map[string]any{"replicas": 3})
	if locked, ok := errors.AsType[*autorecover.LockedError](err); ok {
		fmt.Printf("busy: %s holds web until %s\n", locked.HolderSession, locked.LockedTill)
		return
	}
	if blocked, ok := errors.AsType[*autorecover.BlockedError](err); ok {
		fmt.Printf("web is pending and not recoverable yet: %s (retry in %s)\n", blocked.Decision.Reason, blocked.Decision.RetryAfter)
		return
	}
	if errors.Is(err, autorecover.ErrLost) {
		fmt.Println("lost the lock; the upgrade stopped:", err)
		return
	}
	if err != nil {
		fmt.Println("upgrade failed:", err)
	}
}

func ExampleClient_Acquire() {
	restConfig, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Println(err)
		return
	}
	chrt, err := loader.Load("./charts/web")
	if err != nil {
		fmt.Println(err)
		return
	}

	err = upgradeStepByStep(context.Background(), restConfig, "shop", "web", chrt, map[string]any{"replicas": 3})
	if locked, ok := errors.AsType[*autorecover.LockedError](err); ok {
		fmt.Printf("busy: %s holds web until %s\n", locked.HolderSession, locked.LockedTill)
		return
	}
	if err != nil {
		fmt.Println("upgrade failed:", err)
	}
}

func ExampleFencedStorage() {
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
	lk, err := client.Acquire(ctx, autorecover.LockRequest{Release: "web", Namespace: "shop", Operation: autorecover.OpRollback})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = lk.Release(context.WithoutCancel(ctx)) }()

	// An existing helm configuration keeps its own clients for the objects
	// it applies; only its release records go through the lock's fence.
	// (Lock.ActionConfig fences both.)
	kubeconfig, namespace := os.Getenv("KUBECONFIG"), "shop"
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &kubeconfig, &namespace
	cfg := action.NewConfiguration()
	if err := cfg.Init(getter, namespace, "secret"); err != nil {
		fmt.Println(err)
		return
	}
	if err := autorecover.FencedStorage(cfg, lk); err != nil {
		fmt.Println(err)
		return
	}
	rb := action.NewRollback(cfg)
	rb.Version = 1
	if err := rb.Run("web"); err != nil {
		fmt.Println("rollback failed:", err)
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
	req := autorecover.RecoverRequest{
		Release:   "web",
		Namespace: "shop",
		Policy:    autorecover.Policy{LegacyAfter: 30 * time.Minute},
	}

	// Look first: no lock taken, nothing written.
	req.DryRun = true
	d, err := client.Recover(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Verdict, d.Reason)
	if d.Verdict != autorecover.VerdictRecover {
		return
	}

	req.DryRun = false
	d, err = client.Recover(ctx, req)
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

func ExampleBlockedError() {
	err := error(&autorecover.BlockedError{Decision: autorecover.Decision{
		Verdict:    autorecover.VerdictBlocked,
		Reason:     `release "web" in namespace "shop": revision 4 is pending-upgrade with no lock record covering it (stock helm may have written it); recoverable from 2026-03-01T12:15:01Z`,
		Revision:   4,
		Status:     "pending-upgrade",
		RetryAfter: 13 * time.Minute,
	}})
	fmt.Println(errors.Is(err, autorecover.ErrBlocked))
	if b, ok := errors.AsType[*autorecover.BlockedError](err); ok {
		fmt.Println(b.Decision.Revision, b.Decision.Status, b.Decision.RetryAfter)
	}
	fmt.Println(err)
	// Output:
	// true
	// 4 pending-upgrade 13m0s
	// release "web" in namespace "shop": revision 4 is pending-upgrade with no lock record covering it (stock helm may have written it); recoverable from 2026-03-01T12:15:01Z
}
