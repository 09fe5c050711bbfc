package autorecover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

func TestTranslateLockedError(t *testing.T) {
	till := time.Date(2026, 3, 1, 12, 4, 15, 0, time.UTC)
	internal := &lock.LockedError{
		Release: "web", Namespace: "shop", State: lock.Live, HolderIdentity: "s1",
		Holder:     &lock.Record{Session: "s1", Operation: lock.OpUpgrade, Who: "ci@runner", Timeout: metav1.Duration{Duration: time.Minute}},
		LockedTill: till, Left: 3 * time.Second, Ahead: 2,
	}

	t.Run("at once", func(t *testing.T) {
		err := translate(context.Background(), LockRequest{}, internal)
		pub, ok := errors.AsType[*LockedError](err)
		if !ok || !errors.Is(err, ErrLocked) {
			t.Fatalf("translate = %v, want a *LockedError matching ErrLocked", err)
		}
		if pub.HolderSession != "s1" || pub.Holder.Who != "ci@runner" || pub.Holder.Timeout != time.Minute || !pub.LockedTill.Equal(till) || pub.Ahead != 2 {
			t.Errorf("translated %+v / holder %+v", pub, pub.Holder)
		}
		want := `release "web" in namespace "shop" is locked by ci@runner (session s1, operation upgrade), LOCKED TILL 2026-03-01T12:04:15Z (can be taken over in 3s unless renewed), 2 waiter(s) queued`
		if err.Error() != want {
			t.Errorf("message\n got %s\nwant %s", err, want)
		}
	})

	t.Run("after waiting", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		<-ctx.Done()
		wrapped := fmt.Errorf("gave up waiting (%w): %w", context.Cause(ctx), internal)
		err := translate(ctx, LockRequest{Wait: time.Second}, wrapped)
		if _, ok := errors.AsType[*LockedError](err); !ok || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrLocked) {
			t.Fatalf("translate = %v, want a *LockedError and the context's cause", err)
		}
	})

	t.Run("queued waiters only", func(t *testing.T) {
		err := translate(context.Background(), LockRequest{}, &lock.LockedError{Release: "web", Namespace: "shop", State: lock.Expired, HolderIdentity: "dead", Ahead: 1})
		pub, _ := errors.AsType[*LockedError](err)
		if pub == nil || pub.HolderSession != "" || !strings.Contains(err.Error(), "1 earlier waiter(s) are queued") {
			t.Fatalf("translate = %v (%+v)", err, pub)
		}
	})

	t.Run("ran out of its wait", func(t *testing.T) {
		waited := *internal
		waited.Waited = time.Second
		err := translate(context.Background(), LockRequest{Wait: time.Second}, &waited)
		if _, ok := errors.AsType[*LockedError](err); !ok || !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "gave up waiting for the lock") {
			t.Fatalf("translate = %v, want a *LockedError after giving up waiting", err)
		}
	})

	t.Run("other errors are named", func(t *testing.T) {
		other := errors.New("forbidden")
		if err := translate(context.Background(), LockRequest{}, other); !errors.Is(err, other) || err.Error() != "autorecover: forbidden" {
			t.Fatalf("translate = %v, want the error under the package's name", err)
		}
	})
}

func TestDecisionFrom(t *testing.T) {
	till := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d := decisionFrom(recovery.Decision{
		Verdict: recovery.RecoverThenRollback,
		Reason:  "because",
		Target: recovery.Abandonment{
			Release: helmx.Summary{Revision: 7, Status: common.StatusPendingUpgrade},
			Lock:    &recovery.LockInfo{Session: "s1", Who: "ci", Operation: "upgrade", Revision: 7, LockedTill: till},
		},
		Stray:      []recovery.Abandonment{{Release: helmx.Summary{Revision: 5}}, {Release: helmx.Summary{Revision: 4}}},
		RollbackTo: 3,
	})
	if d.Verdict != VerdictRecoverThenRollback || d.Revision != 7 || d.Status != "pending-upgrade" || d.RollbackTo != 3 ||
		d.AbandonedBy == nil || d.AbandonedBy.Session != "s1" || !d.AbandonedBy.LockedTill.Equal(till) ||
		fmt.Sprint(d.Stray) != "[5 4]" || d.Reason != "because" {
		t.Fatalf("decisionFrom = %+v", d)
	}
}

// offlineClient is a Client for a server that is never contacted: the
// checks below fail before any request.
func offlineClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFencedStorage(t *testing.T) {
	unguarded := func(c *Client) *Lock {
		return &Lock{c: c, release: "web", namespace: "shop", fence: &helmx.WriteFence{}}
	}

	t.Run("refuses another driver", func(t *testing.T) {
		cfg := action.NewConfiguration()
		cfg.Releases = storage.Init(driver.NewMemory())
		err := FencedStorage(cfg, unguarded(offlineClient(t)))
		if err == nil || !strings.Contains(err.Error(), `"Memory" driver`) {
			t.Fatalf("FencedStorage over the memory driver = %v, want a refusal naming it", err)
		}
		if cfg.Releases.Name() != "Memory" {
			t.Fatal("the configuration's storage was replaced although fencing was refused")
		}
	})

	t.Run("refuses a driver other than the client's", func(t *testing.T) {
		cfg := action.NewConfiguration()
		cfg.Releases = storage.Init(driver.NewSecrets(fake.NewClientset().CoreV1().Secrets("shop")))
		err := FencedStorage(cfg, unguarded(offlineClient(t, WithStorageDriver("configmap"))))
		if err == nil || !strings.Contains(err.Error(), `"Secret" driver`) || !strings.Contains(err.Error(), "configmap") {
			t.Fatalf("FencedStorage of a secret configuration for a configmap client = %v, want a refusal naming both", err)
		}
		if cfg.Releases.Name() != driver.SecretsDriverName {
			t.Fatal("the configuration's storage was replaced although fencing was refused")
		}
	})

	for _, tc := range []struct{ client, want string }{{"", driver.SecretsDriverName}, {"configmap", driver.ConfigMapsDriverName}} {
		t.Run("replaces the storage, "+tc.want, func(t *testing.T) {
			cfg := action.NewConfiguration()
			var own driver.Driver = driver.NewSecrets(fake.NewClientset().CoreV1().Secrets("shop"))
			if tc.client == "configmap" {
				own = driver.NewConfigMaps(fake.NewClientset().CoreV1().ConfigMaps("shop"))
			}
			before := storage.Init(own)
			before.MaxHistory = 7
			cfg.Releases = before
			if err := FencedStorage(cfg, unguarded(offlineClient(t, WithStorageDriver(tc.client)))); err != nil {
				t.Fatal(err)
			}
			if cfg.Releases == before || cfg.Releases.Driver == own {
				t.Fatal("FencedStorage kept the configuration's own storage")
			}
			if cfg.Releases.Name() != tc.want || cfg.Releases.MaxHistory != 7 {
				t.Fatalf("fenced storage: driver %s, MaxHistory %d; want %s and 7", cfg.Releases.Name(), cfg.Releases.MaxHistory, tc.want)
			}
		})
	}

	t.Run("nil arguments", func(t *testing.T) {
		if err := FencedStorage(action.NewConfiguration(), nil); err == nil {
			t.Fatal("FencedStorage accepted a nil lock")
		}
		if err := FencedStorage(nil, unguarded(offlineClient(t))); err == nil {
			t.Fatal("FencedStorage accepted a nil configuration")
		}
	})
}

func TestNewClientOptions(t *testing.T) {
	if _, err := NewClient(nil); err == nil {
		t.Error("NewClient(nil) succeeded")
	}
	for _, b := range []Backend{BackendAuto, BackendLease, BackendRelease} {
		if _, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, WithLockBackend(b)); err != nil {
			t.Errorf("WithLockBackend(%s): %v", b, err)
		}
	}
	if _, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, WithLockBackend("etcd")); err == nil || !strings.Contains(err.Error(), `"etcd"`) {
		t.Errorf("WithLockBackend(etcd) = %v, want a refusal naming it", err)
	}
	for _, d := range []string{"", "secret", "secrets", "configmap", "configmaps"} {
		if _, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, WithStorageDriver(d)); err != nil {
			t.Errorf("WithStorageDriver(%q): %v", d, err)
		}
	}
	for _, d := range []string{"sql", "memory"} {
		if _, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, WithStorageDriver(d)); err == nil {
			t.Errorf("WithStorageDriver(%q) succeeded; its releases cannot be fenced", d)
		}
	}
}

// TestRefusedBeforeAnyRequest: requests that cannot be served fail before
// the client talks to the (here unreachable) server.
func TestRefusedBeforeAnyRequest(t *testing.T) {
	c := offlineClient(t)
	ctx := context.Background()
	if _, err := c.Acquire(ctx, LockRequest{Release: "Not_A_Release", Namespace: "shop", Operation: OpUpgrade}); err == nil || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("Acquire of an invalid release name = %v, want a refusal before any request", err)
	}
	if _, err := c.Acquire(ctx, LockRequest{Release: "web", Namespace: "shop"}); err == nil || !strings.Contains(err.Error(), "no operation") {
		t.Errorf("Acquire without an operation = %v, want a refusal", err)
	}
	if err := c.Run(ctx, RunConfig{Lock: LockRequest{Release: "web", Namespace: "shop", Operation: OpUpgrade}}, nil); err == nil || !strings.Contains(err.Error(), "no operation") {
		t.Errorf("Run without an operation = %v, want a refusal", err)
	}
	called := false
	err := c.Run(ctx, RunConfig{Lock: LockRequest{Release: "web", Namespace: "shop"}}, func(context.Context, *action.Configuration) error {
		called = true
		return nil
	})
	if err == nil || called {
		t.Errorf("Run with a lock request without an operation = %v (op called: %t), want a refusal before op", err, called)
	}
	if _, err := c.Recover(ctx, RecoverRequest{Release: "Not_A_Release", Namespace: "shop", DryRun: true}); err == nil || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("dry-run Recover of an invalid release name = %v, want a refusal before any request", err)
	}
	if _, err := c.Inspect(ctx, "shop", "Not_A_Release"); err == nil || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("Inspect of an invalid release name = %v, want a refusal before any request", err)
	}
}

func TestLostCause(t *testing.T) {
	opErr := errors.New("context canceled while waiting for the rollout")
	lost := fmt.Errorf("lock on release %q was taken over: %w", "web", ErrLost)

	ctx, cancel := context.WithCancelCause(context.Background())
	if err := lostCause(ctx, opErr); err != opErr { //nolint:errorlint // identity is the point
		t.Errorf("lostCause with the lock held = %v, want op's error unchanged", err)
	}
	cancel(lost)
	err := lostCause(ctx, opErr)
	if !errors.Is(err, ErrLost) || !errors.Is(err, opErr) {
		t.Errorf("lostCause after the loss = %v, want both the loss and op's error", err)
	}
	if err := lostCause(ctx, nil); err != nil {
		t.Errorf("lostCause(nil) = %v", err)
	}
	if err := lostCause(ctx, lost); err != lost { //nolint:errorlint // identity is the point
		t.Errorf("lostCause of the cause itself = %v, want it unchanged", err)
	}

	ctx, cancel = context.WithCancelCause(context.Background())
	cancel(errors.New("caller gave up"))
	if err := lostCause(ctx, opErr); err != opErr { //nolint:errorlint // identity is the point
		t.Errorf("lostCause after a cancellation that is no loss = %v, want op's error unchanged", err)
	}
	ctx, cancel = context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("held too long: %w", ErrMaxHold))
	if err := lostCause(ctx, opErr); !errors.Is(err, ErrMaxHold) {
		t.Errorf("lostCause after the maximum hold = %v, want ErrMaxHold", err)
	}
}

func TestBlockedError(t *testing.T) {
	err := error(&BlockedError{Decision: Decision{Verdict: VerdictBlocked, Reason: "pending since a minute"}})
	if !errors.Is(err, ErrBlocked) || err.Error() != "pending since a minute" {
		t.Fatalf("BlockedError = %v (is ErrBlocked: %t)", err, errors.Is(err, ErrBlocked))
	}
	if errors.Is(err, ErrLocked) || errors.Is(err, ErrLost) {
		t.Fatal("BlockedError matches another sentinel")
	}
}

func TestStateFrom(t *testing.T) {
	for in, want := range map[lock.State]LockState{lock.Free: LockFree, lock.Live: LockLive, lock.Expired: LockExpired} {
		if got := stateFrom(in, false); got != want {
			t.Errorf("stateFrom(%v) = %s, want %s", in, got, want)
		}
	}
	if got := stateFrom(lock.Expired, true); got != LockLive {
		t.Errorf("an expiry not yet confirmed on this client's clock reads %s, want %s", got, LockLive)
	}
}
