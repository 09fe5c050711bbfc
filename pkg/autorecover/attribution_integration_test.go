package autorecover_test

import (
	"context"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// TestIntegrationStockRevisionUnderDeadStampIsLegacy (issue 11 item 10): a
// holder records revision 2 in its lock (the Lease as well as the record)
// and dies before creating it; stock helm creates revision 2 in that window
// and may still be running it. The revision's record carries no lock of
// the dead holder, so it is not attributed to it: the next client, and the
// one after it, treat it as stock helm's (legacy, blocked while young) and
// write nothing to it.
func TestIntegrationStockRevisionUnderDeadStampIsLegacy(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	installStock(t, env, ns)
	lease := autorecover.WithLockBackend(autorecover.BackendLease)

	dead, err := newClient(t, env.Config, lease).Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Stock helm's upgrade creates revision 2 before the holder does; the
	// holder dies (it is never renewed nor released).
	createStockPending(t, env, ns)

	young := autorecover.Policy{LegacyAfter: time.Hour}
	for _, who := range []string{"the next client", "the client after it"} {
		lk, err := newClient(t, env.Config, lease).Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: generous})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		d, err := lk.Recover(ctx, young)
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if d.Verdict != autorecover.VerdictBlocked || len(d.Marked) != 0 || d.AbandonedBy != nil {
			t.Fatalf("%s: recovery = %s (%s), abandoned by %+v, marked %v; want Blocked as stock helm's young revision, nothing marked (dead holder %s)", who, d.Verdict, d.Reason, d.AbandonedBy, d.Marked, dead.Session())
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("%s: release: %v", who, err)
		}
		if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
			t.Fatalf("%s: history = %s; want revision 2 left pending", who, got)
		}
		t.Logf("%s: %s", who, d.Reason)
	}
}
