package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestStockHelmInterop is invariant S6 from stock helm's side: stock helm
// v4 and v3 stay blocked by the pending revision of an operation we run,
// exactly as by one of their own, and once ours has ended they read and
// write the release as usual.
func TestStockHelmInterop(t *testing.T) {
	t.Parallel()
	stockHelmInterop(t, "lease", leaseLock)
}

// TestStockHelmInteropReleaseBackend is TestStockHelmInterop with the lock
// in the release records: stock helm reads records that carry our lock
// annotation, and drops it when it rewrites them.
func TestStockHelmInteropReleaseBackend(t *testing.T) {
	t.Parallel()
	stockHelmInterop(t, "release", recordLock)
}

func stockHelmInterop(t *testing.T, backend string, read lockReader) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "interop"
	stock := []struct{ name, bin string }{{"helm4", env.Helm4}, {"helm3", env.Helm3}}

	flag := []string{"--lock-backend", backend}
	mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, flag)...)
	ours := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "20s", "--set", "message=ours"}, unschedulable, flag)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	waitForWriterIn(t, env, read, ns, rel, 2, 10*time.Second)

	for _, h := range stock {
		res := env.Run(t, h.bin, "upgrade", rel, chart, "-n", ns, "--set", "message="+h.name)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, anotherOperation) {
			t.Fatalf("%s upgrade while ours runs: exit %d, stderr %q; want a failure with %q", h.name, res.ExitCode, res.Stderr, anotherOperation)
		}
	}
	if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history while ours runs = %v; want it untouched by stock helm", got)
	}
	if code := ours.Wait(t, 2*time.Minute); code != 1 {
		t.Fatalf("our upgrade: exit %d; want 1 (its wait timed out)\nstderr:\n%s", code, ours.Stderr.String())
	}
	wantHistory(t, env, ns, rel, "1:deployed 2:failed")
	waitLockFreeIn(t, env, read, ns, rel, 5*time.Second)

	// Stock helm reads and writes everything we wrote.
	rev := 2
	for _, h := range stock {
		res := mustRun(t, env, h.bin, "history", rel, "-n", ns)
		if !strings.Contains(res.Stdout, "failed") || !strings.Contains(res.Stdout, "deployed") {
			t.Errorf("%s history:\n%s", h.name, res.Stdout)
		}
		res = mustRun(t, env, h.bin, "status", rel, "-n", ns)
		if !strings.Contains(res.Stdout, "NAME: "+rel) {
			t.Errorf("%s status:\n%s", h.name, res.Stdout)
		}
		res = mustRun(t, env, h.bin, "get", "values", rel, "-n", ns, "--all")
		if !strings.Contains(res.Stdout, "message:") {
			t.Errorf("%s get values --all:\n%s", h.name, res.Stdout)
		}
		mustRun(t, env, h.bin, "get", "all", rel, "-n", ns)
		mustRun(t, env, h.bin, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "60s", "--set", "message="+h.name)
		rev++
		mustRun(t, env, h.bin, "rollback", rel, "1", "-n", ns, "--wait", "--timeout", "60s")
		rev++
		env.WaitForStatus(t, ns, rel, rev, "deployed", 5*time.Second)
	}
	// And we carry on after them.
	mustRun(t, env, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "60s", "--set", "message=final"}, flag)...)
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:superseded 4:superseded 5:superseded 6:superseded 7:deployed")
}

// TestLegacyStuckRelease is invariant S6 for releases stock helm left stuck:
// with no lock record, a pending revision is recovered only once it is older
// than --recover-legacy-after in server time, and refused before.
func TestLegacyStuckRelease(t *testing.T) {
	t.Parallel()
	legacyStuckRelease(t, "lease")
}

// TestLegacyStuckReleaseReleaseBackend is TestLegacyStuckRelease with
// --lock-backend=release.
func TestLegacyStuckReleaseReleaseBackend(t *testing.T) {
	t.Parallel()
	legacyStuckRelease(t, "release")
}

func legacyStuckRelease(t *testing.T, backend string) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "legacy"
	const legacyAfter = 20 * time.Second
	legacy := []string{"--recover-legacy-after", legacyAfter.String(), "--lock-backend", backend}

	mustRun(t, env, env.Helm4, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
	p := env.Start(t, env.Helm4, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)
	// The Secret's creationTimestamp is whole server seconds; the server
	// runs on this machine, so the local clock measures its age.
	created := revisions(t, env, ns, rel)[1].CreationTimestamp
	if l, _ := lease(t, env, ns, rel); l != nil {
		t.Fatalf("stock helm left a lock lease %s; the release must have no lock record", l.Name)
	}

	refuse := func() {
		t.Helper()
		res := env.Run(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=v3"}, legacy)...)
		age := time.Since(created)
		if res.ExitCode != exitcode.Pending {
			t.Fatalf("upgrade of a stock-helm pending revision aged %s: exit %d; want %d (pending, not recoverable yet)\nstderr:\n%s",
				secs(age), res.ExitCode, exitcode.Pending, res.Stderr)
		}
		if !strings.Contains(res.Stderr, "--recover-legacy-after") {
			t.Errorf("refusal does not name --recover-legacy-after:\n%s", res.Stderr)
		}
		figure(t, "legacy refused at age: %s (recover-legacy-after %s)", secs(age), legacyAfter)
	}
	refuse()
	// Just before the age is reached (the timestamp may be up to 1 s early).
	time.Sleep(time.Until(created.Add(legacyAfter - 2*time.Second)))
	refuse()
	if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refusals = %v; want it untouched", got)
	}

	// Past the age, plus the timestamp's resolution and the uncertainty of
	// a fresh process's server-time estimate.
	time.Sleep(time.Until(created.Add(legacyAfter + 3*time.Second)))
	res := mustRun(t, env, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=v3"}, legacy)...)
	figure(t, "legacy recovered at age: %s (recover-legacy-after %s)", secs(time.Since(created)-res.Elapsed), legacyAfter)
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	if d := revs[1].Description; !strings.Contains(d, "Abandoned pending-upgrade with no lock record") {
		t.Errorf("abandoned revision description = %q; want it to say it had no lock record", d)
	}
	t.Logf("abandoned revision 2: %s", revs[1].Description)
}
