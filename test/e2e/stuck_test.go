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
	for name, helm := range map[string]string{"helm4": env.Helm4, "helm3": env.Helm3} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			const rel = "stuck"
			chart := env.Chart("app")

			res := env.Run(t, helm, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
			if res.ExitCode != 0 {
				t.Fatalf("install failed: %s", res.Stderr)
			}
			env.WaitForStatus(t, ns, rel, 1, "deployed", 5*time.Second)

			// Pods of revision 2 can never be scheduled, so --wait holds the
			// operation open until we kill it.
			p := env.Start(t, helm, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
				"--set", "nodeSelector.never=matches", "--set", "message=v2")
			env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
			p.Kill(t)

			time.Sleep(500 * time.Millisecond)
			if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:superseded 2:pending-upgrade" &&
				strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
				t.Fatalf("after SIGKILL, history = %v; want revision 2 pending-upgrade", got)
			}
			res = env.Run(t, helm, "upgrade", rel, chart, "-n", ns, "--set", "message=v3")
			if res.ExitCode == 0 {
				t.Fatalf("second upgrade succeeded on a stuck release; want %q", anotherOperation)
			}
			if !strings.Contains(res.Stderr, anotherOperation) {
				t.Fatalf("second upgrade stderr = %q; want it to contain %q", res.Stderr, anotherOperation)
			}
			if got := env.Summary(t, ns, rel); got[len(got)-1] != "2:pending-upgrade" {
				t.Fatalf("history after the refused upgrade = %v; want it unchanged", got)
			}
		})
	}
}

// TestStockHelmSQLGetsStuck is the same with helm's SQL storage driver
// (HELM_DRIVER=sql) on a real PostgreSQL server: the killed upgrade leaves
// revision 2 pending-upgrade in the releases_v1 table, and the next upgrade
// fails. The fixture for issue 15's sql driver.
func TestStockHelmSQLGetsStuck(t *testing.T) {
	env := testenv.Get(t)
	for name, helm := range map[string]string{"helm4": env.Helm4, "helm3": env.Helm3} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			dsn := env.Postgres(t)
			sqlEnv := []string{"HELM_DRIVER=sql", "HELM_DRIVER_SQL_CONNECTION_STRING=" + dsn}
			const rel = "stuck"
			chart := env.Chart("app")

			res := env.RunEnv(t, sqlEnv, helm, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
			if res.ExitCode != 0 {
				t.Fatalf("install failed: %s", res.Stderr)
			}
			testenv.WaitForSQLStatus(t, dsn, ns, rel, 1, "deployed", 5*time.Second)
			if got := env.Summary(t, ns, rel); len(got) != 0 {
				t.Fatalf("with HELM_DRIVER=sql, helm also wrote release Secrets: %v", got)
			}

			p := env.StartEnv(t, sqlEnv, helm, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
				"--set", "nodeSelector.never=matches", "--set", "message=v2")
			testenv.WaitForSQLStatus(t, dsn, ns, rel, 2, "pending-upgrade", 60*time.Second)
			p.Kill(t)

			res = env.RunEnv(t, sqlEnv, helm, "upgrade", rel, chart, "-n", ns, "--set", "message=v3")
			if res.ExitCode == 0 {
				t.Fatalf("second upgrade succeeded on a stuck release; want %q", anotherOperation)
			}
			if !strings.Contains(res.Stderr, anotherOperation) {
				t.Fatalf("second upgrade stderr = %q; want it to contain %q", res.Stderr, anotherOperation)
			}
			if got := testenv.SQLHistory(t, dsn, ns, rel); got[len(got)-1] != "2:pending-upgrade" {
				t.Fatalf("history after the refused upgrade = %v; want revision 2 still pending-upgrade", got)
			}
		})
	}
}
