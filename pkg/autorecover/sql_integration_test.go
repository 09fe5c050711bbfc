package autorecover_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// connections waits until the server counts at most most connections to
// the database, other than the counting one, and returns the count: a
// closed connection's server process ends a little after the client left
// it. It gives up after a generous wait.
func connections(t *testing.T, db *sql.DB, most int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n <= most || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIntegrationSQL: the Go package with helm's sql driver, on the real
// PostgreSQL the CLI's sql tests use: Run installs and upgrades through
// helm's own sql driver under the lock row; each lock's pool of helm's is
// closed when the lock is given back, the client's own by Close; a holder
// whose lock was taken over has its writes refused by the database.
func TestIntegrationSQL(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	dsn := env.Postgres(t)
	ns := env.Namespace(t)
	probe, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = probe.Close() }()
	probe.SetMaxOpenConns(1)

	c := newClient(t, env.Config, autorecover.WithStorageDriver("sql"), autorecover.WithSQLConnectionString(dsn))
	install := func(ctx context.Context, cfg *action.Configuration) error {
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace = releaseName, ns
		in.WaitStrategy = kube.HookOnlyStrategy
		_, err := in.RunWithContext(ctx, appChart(t, env), map[string]any{"message": "sql"})
		return err
	}
	if err := c.Run(ctx, autorecover.RunConfig{Lock: autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpInstall, Timeout: time.Minute}}, install); err != nil {
		t.Fatalf("install with Run: %v", err)
	}
	for i := range 3 {
		if err := c.Run(ctx, autorecover.RunConfig{Lock: upgradeRequest(ns)}, runUpgrade(t, env, ns, map[string]any{"message": "sql", "n": i})); err != nil {
			t.Fatalf("upgrade %d with Run: %v", i+1, err)
		}
	}
	want := []string{"1:superseded", "2:superseded", "3:superseded", "4:deployed"}
	if got := testenv.SQLHistory(t, dsn, ns, releaseName); !slices.Equal(got, want) {
		t.Fatalf("history in the sql database = %v, want %v", got, want)
	}
	// Four operations, each with helm's own pool: only the client's pool
	// (at most two idle connections, database/sql's default) is left.
	if n := connections(t, probe, 2); n > 2 {
		t.Errorf("%d connections left to the database after four Runs, want at most the client's own 2: a lock's pool of helm's was not closed", n)
	}
	st, err := c.Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockFree || st.Pending || st.LatestRevision != 4 || st.Holder == nil || st.Holder.Revision != 4 {
		t.Fatalf("Inspect after the upgrades = %+v (holder %+v)", st, st.Holder)
	}

	t.Run("a holder whose lock was taken over is refused by the database", func(t *testing.T) {
		old := newClient(t, env.Config, autorecover.WithStorageDriver("sql"), autorecover.WithSQLConnectionString(dsn))
		defer func() { _ = old.Close() }()
		req := upgradeRequest(ns)
		req.LeaseDuration = 3 * time.Second
		lk, err := old.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := lk.ActionConfig()
		if err != nil {
			t.Fatal(err)
		}
		last, err := cfg.Releases.Last(releaseName)
		if err != nil {
			t.Fatal(err)
		}
		// Never renewed (no Keep): another client takes it over once it
		// expires.
		next := upgradeRequest(ns)
		next.Wait = generous
		taker, err := c.Acquire(ctx, next)
		if err != nil {
			t.Fatalf("taking over the expired lock: %v", err)
		}
		rel := last.(*rspb.Release)
		rel.Info.Description = "written by a holder that lost its lock"
		if err := cfg.Releases.Update(rel); err == nil {
			t.Fatal("helm's sql driver wrote for a session whose lock row was taken over")
		} else {
			t.Logf("refused: %v", err)
		}
		if err := taker.Release(ctx); err != nil {
			t.Fatal(err)
		}
		_ = lk.Release(ctx)
		// Its pool closed with the lock: nothing more goes through it.
		if _, err := cfg.Releases.Last(releaseName); err == nil {
			t.Error("helm's sql driver of a released lock still reads: its pool was not closed")
		}
		if got := testenv.SQLHistory(t, dsn, ns, releaseName); !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
	})

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := connections(t, probe, 0); n != 0 {
		t.Errorf("%d connections left to the database after Close, want 0", n)
	}
	if err := c.Run(ctx, autorecover.RunConfig{Lock: upgradeRequest(ns)}, runUpgrade(t, env, ns, nil)); err == nil || errors.Is(err, autorecover.ErrLocked) {
		t.Errorf("Run after Close = %v, want the closed database's error", err)
	}
}

// TestSQLNeedsConnectionString: the sql driver without a connection string
// is refused when the client is made, naming what to set.
func TestSQLNeedsConnectionString(t *testing.T) {
	t.Setenv(autorecover.EnvSQLConnectionString, "")
	_, err := autorecover.NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, autorecover.WithStorageDriver("sql"))
	if err == nil || !strings.Contains(err.Error(), autorecover.EnvSQLConnectionString) {
		t.Fatalf("NewClient(sql) without a connection string = %v", err)
	}
	_, err = autorecover.NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, autorecover.WithStorageDriver("memory"))
	if err == nil || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("NewClient(memory) = %v", err)
	}
}
