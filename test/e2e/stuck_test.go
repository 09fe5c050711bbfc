package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// anotherOperation is the error stock helm prints for a pending release.
const anotherOperation = "another operation (install/upgrade/rollback) is in progress"

// TestStockHelmGetsStuck reproduces the problem this project solves, with
// the real upstream helm binaries: an upgrade killed with SIGKILL while it
// waits leaves the release pending-upgrade, and every later upgrade fails.
// These are the regression fixtures for all later work.
func TestStockHelmGetsStuck(t *testing.T) {
	env := testenv.Get(t)
	for name, helm := range helms(env) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			stockHelmGetsStuck(t, env, helm, ns, nil, func() []string { return env.Summary(t, ns, stuckRelease) })
		})
	}
}

// TestStockHelmSQLGetsStuck is the same with helm's SQL storage driver
// (HELM_DRIVER=sql) on a real PostgreSQL server: the killed upgrade leaves
// revision 2 pending-upgrade in the releases_v1 table, and the next upgrade
// fails. The fixture for issue 15's sql driver.
func TestStockHelmSQLGetsStuck(t *testing.T) {
	env := testenv.Get(t)
	for name, helm := range helms(env) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			dsn := env.Postgres(t)
			sqlEnv := []string{"HELM_DRIVER=sql", "HELM_DRIVER_SQL_CONNECTION_STRING=" + dsn}
			stockHelmGetsStuck(t, env, helm, ns, sqlEnv, func() []string { return testenv.SQLHistory(t, dsn, ns, stuckRelease) })
			if got := env.Summary(t, ns, stuckRelease); len(got) != 0 {
				t.Fatalf("with HELM_DRIVER=sql, helm also wrote release Secrets: %v", got)
			}
		})
	}
}

const stuckRelease = "stuck"

// stockHelmGetsStuck installs stuckRelease in ns with helm (extra: its
// environment, the storage driver's), kills an upgrade that waits, and
// checks that the next upgrade is refused and the history, as history
// reads it from the driver's store, left pending.
func stockHelmGetsStuck(t *testing.T, env *testenv.Env, helm, ns string, extra []string, history func() []string) {
	t.Helper()
	const rel = stuckRelease
	chart := env.Chart("app")
	what := ns + "/" + rel

	res := env.RunEnv(t, extra, helm, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
	if res.ExitCode != 0 {
		t.Fatalf("install failed: %s", res.Stderr)
	}
	testenv.WaitForLatest(t, what, history, 1, "deployed", 5*time.Second)

	// Pods of revision 2 can never be scheduled, so --wait holds the
	// operation open until we kill it.
	p := env.StartEnv(t, extra, helm, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
		"--set", "nodeSelector.never=matches", "--set", "message=v2")
	testenv.WaitForLatest(t, what, history, 2, "pending-upgrade", 60*time.Second)
	// Killed and reaped while it waited for pods: it has no write in flight.
	p.Kill(t)
	if got := history(); strings.Join(got, " ") != "1:superseded 2:pending-upgrade" &&
		strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("after SIGKILL, history = %v; want revision 2 pending-upgrade", got)
	}
	res = env.RunEnv(t, extra, helm, "upgrade", rel, chart, "-n", ns, "--set", "message=v3")
	if res.ExitCode == 0 {
		t.Fatalf("second upgrade succeeded on a stuck release; want %q", anotherOperation)
	}
	if !strings.Contains(res.Stderr, anotherOperation) {
		t.Fatalf("second upgrade stderr = %q; want it to contain %q", res.Stderr, anotherOperation)
	}
	if got := history(); got[len(got)-1] != "2:pending-upgrade" {
		t.Fatalf("history after the refused upgrade = %v; want it unchanged", got)
	}
}
