package recovery

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestIntegrationMarkFailedRace: two recoverers race for one abandoned
// revision on a real API server; the resourceVersion precondition lets
// exactly one win, and the loser learns it must decide again.
func TestIntegrationMarkFailedRace(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	target := storePending(t, env.Client, ns, common.StatusPendingUpgrade)
	if target.CreationTimestamp.IsZero() || target.LastWriteTime.IsZero() {
		t.Fatalf("the API server set no creationTimestamp or managedFields time: %+v", target)
	}

	descs := []string{"recovered by A", "recovered by B"}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 {
		wg.Go(func() {
			<-start
			_, errs[i] = MarkFailed(ctx, helmx.SecretRecords(env.Client), ns, target, descs[i], time.Now())
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("both MarkFailed calls succeeded")
			}
			winner = i
		case errors.Is(err, ErrConflict), errors.Is(err, ErrNotPending):
			t.Logf("loser %d: %v", i, err)
		default:
			t.Fatalf("MarkFailed %d: unexpected error: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no MarkFailed call succeeded: %v", errs)
	}

	rel, err := driver.NewSecrets(env.Client.CoreV1().Secrets(ns)).Get(target.RecordName)
	if err != nil {
		t.Fatalf("stock helm cannot read the recovered revision: %v", err)
	}
	r := rel.(*rspb.Release)
	if r.Info.Status != common.StatusFailed || r.Info.Description != descs[winner] {
		t.Errorf("stored status %q description %q, want failed and %q", r.Info.Status, r.Info.Description, descs[winner])
	}
}

// TestIntegrationMarkFailedStale: a write in between the read and the
// recovery write is never overwritten, whether the recovery notices it
// before writing or the API server refuses the write.
func TestIntegrationMarkFailedStale(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()

	touch := func(t *testing.T, ns, name string) {
		t.Helper()
		s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels["touched"] = "yes"
		if _, err := env.Client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	checkUntouchedByUs := func(t *testing.T, ns, name string) {
		t.Helper()
		s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sum, err := helmx.Summarize(s)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Status != common.StatusPendingUpgrade || s.Labels["status"] != "pending-upgrade" || s.Labels["touched"] != "yes" {
			t.Errorf("the other writer's change was overwritten: status %q labels %v", sum.Status, s.Labels)
		}
	}

	t.Run("changed after the decision read", func(t *testing.T) {
		ns := env.Namespace(t)
		target := storePending(t, env.Client, ns, common.StatusPendingUpgrade)
		touch(t, ns, target.RecordName)
		_, err := MarkFailed(ctx, helmx.SecretRecords(env.Client), ns, target, "d", time.Now())
		if !errors.Is(err, ErrConflict) {
			t.Fatalf("got %v, want ErrConflict", err)
		}
		checkUntouchedByUs(t, ns, target.RecordName)
	})

	t.Run("changed between MarkFailed's read and its write", func(t *testing.T) {
		ns := env.Namespace(t)
		target := storePending(t, env.Client, ns, common.StatusPendingUpgrade)
		testHookBeforeUpdate = func() { touch(t, ns, target.RecordName) }
		t.Cleanup(func() { testHookBeforeUpdate = nil })
		_, err := MarkFailed(ctx, helmx.SecretRecords(env.Client), ns, target, "d", time.Now())
		if !errors.Is(err, ErrConflict) || !apierrors.IsConflict(err) {
			t.Fatalf("got %v, want ErrConflict from the API server's 409", err)
		}
		checkUntouchedByUs(t, ns, target.RecordName)
	})
}

// TestIntegrationLastWriteTimeMoves checks what Decide's rule 5 assumes of a
// real API server: an in-place write (helm sets uninstalling this way)
// advances the server-set managedFields time past creationTimestamp.
func TestIntegrationLastWriteTimeMoves(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	rel := helmRelease("web", ns, 1, common.StatusDeployed)
	key := helmx.ReleaseSecretName("web", 1)
	d := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := d.Create(key, rel); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // server timestamps keep whole seconds
	rel.Info.Status = common.StatusUninstalling
	if err := d.Update(key, rel); err != nil {
		t.Fatal(err)
	}
	s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := helmx.Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.LastWriteTime.After(sum.CreationTimestamp) {
		t.Fatalf("managedFields time %v did not move past creationTimestamp %v after an in-place update", sum.LastWriteTime, sum.CreationTimestamp)
	}
	t.Logf("created %s, uninstalling written %s (server time)", sum.CreationTimestamp.Format(time.RFC3339), sum.LastWriteTime.Format(time.RFC3339))
}
