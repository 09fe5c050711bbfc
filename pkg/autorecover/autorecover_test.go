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
		err := translate(context.Background(), internal)
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
		err := translate(ctx, wrapped)
		if _, ok := errors.AsType[*LockedError](err); !ok || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrLocked) {
			t.Fatalf("translate = %v, want a *LockedError and the context's cause", err)
		}
	})

	t.Run("queued waiters only", func(t *testing.T) {
		err := translate(context.Background(), &lock.LockedError{Release: "web", Namespace: "shop", State: lock.Expired, HolderIdentity: "dead", Ahead: 1})
		pub, _ := errors.AsType[*LockedError](err)
		if pub == nil || pub.HolderSession != "" || !strings.Contains(err.Error(), "1 earlier waiter(s) are queued") {
			t.Fatalf("translate = %v (%+v)", err, pub)
		}
	})

	t.Run("other errors pass through", func(t *testing.T) {
		other := errors.New("forbidden")
		if err := translate(context.Background(), other); err != other { //nolint:errorlint // identity is the point
			t.Fatalf("translate = %v, want the error unchanged", err)
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
	for v, want := range map[recovery.Verdict]Verdict{
		recovery.NoRelease: VerdictNoRelease, recovery.Proceed: VerdictProceed, recovery.Recover: VerdictRecover,
		recovery.RecoverThenRollback: VerdictRecoverThenRollback, recovery.Blocked: VerdictBlocked,
		recovery.Verdict(99): VerdictBlocked,
	} {
		if got := verdictFrom(v); got != want {
			t.Errorf("verdictFrom(%v) = %s, want %s", v, got, want)
		}
	}
}

func TestFencedStorageOnlyFencesSecrets(t *testing.T) {
	cfg := action.NewConfiguration()
	cfg.Releases = storage.Init(driver.NewMemory())
	err := FencedStorage(cfg, &Lock{})
	if err == nil || !strings.Contains(err.Error(), `"Memory" driver`) {
		t.Fatalf("FencedStorage over the memory driver = %v, want a refusal naming it", err)
	}
	if cfg.Releases.Name() != "Memory" {
		t.Fatal("the configuration's storage was replaced although fencing was refused")
	}
	if err := FencedStorage(cfg, nil); err == nil {
		t.Fatal("FencedStorage accepted a nil lock")
	}
}
