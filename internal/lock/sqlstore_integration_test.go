package lock_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// sqlStores maps a top-level test to the sql database its backends keep
// their locks in (TestIntegrationSQLStore); a test not in it uses Leases.
var sqlStores sync.Map

func sqlStoreOf(t *testing.T) (*sqlstore.Store, bool) {
	top, _, _ := strings.Cut(t.Name(), "/")
	v, ok := sqlStores.Load(top)
	if !ok {
		return nil, false
	}
	return v.(*sqlstore.Store), true
}

// storeBackend is newBackend's backend over cs: a Lease backend, or the
// lock rows of the test's sql database.
func storeBackend(t *testing.T, cs kubernetes.Interface, est *servertime.Estimator, clk clock.Clock) *lock.Backend {
	if st, ok := sqlStoreOf(t); ok {
		return lock.NewBackend(cs, est, clk, lock.StoreSQL, st.Locks)
	}
	return leasestore.NewBackend(cs, est, clk)
}

// lockObjectExists reports whether the release's lock object (the Lease,
// or the lock row) exists.
func lockObjectExists(t *testing.T, env *testenv.Env, ns, release string) bool {
	t.Helper()
	ctx := context.Background()
	var err error
	if st, ok := sqlStoreOf(t); ok {
		_, err = st.Locks(ns).Read(ctx, lock.LeaseName(release))
	} else {
		_, err = env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName(release), metav1.GetOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestIntegrationSQLStore runs the lock's integration cases with the lock
// kept in rows of helm's sql database (lock.StoreSQL on the real
// PostgreSQL), judged in the real API server's clock by clients whose own
// clocks are skewed: the row store must behave as the Lease does.
func TestIntegrationSQLStore(t *testing.T) {
	env := testenv.Get(t)
	st, err := sqlstore.Open(env.Postgres(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	sqlStores.Store(t.Name(), st)
	t.Cleanup(func() { sqlStores.Delete(t.Name()) })
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"RaceOneWinner", TestIntegrationRaceOneWinner},
		{"TakeoverOnlyAfterExpiry", TestIntegrationTakeoverOnlyAfterExpiry},
		{"RenewAfterTakeoverIsLost", TestIntegrationRenewAfterTakeoverIsLost},
		{"KeepHoldsPastManyLeases", TestIntegrationKeepHoldsPastManyLeases},
		{"WaiterStartsWithinOneSecondOfRelease", TestIntegrationWaiterStartsWithinOneSecondOfRelease},
		{"WaiterTakesOverDeadHolderAtExpiry", TestIntegrationWaiterTakesOverDeadHolderAtExpiry},
		{"WaitersServedInArrivalOrder", TestIntegrationWaitersServedInArrivalOrder},
		{"ReleaseAndDelete", TestIntegrationReleaseAndDelete},
	} {
		t.Run(c.name, c.f)
	}
}
