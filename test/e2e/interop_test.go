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
	flag := []string{"--lock-backend", backend}

	mustRun(t, env, env.Helm4, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
	p := env.Start(t, env.Helm4, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)
	created := revisions(t, env, ns, rel)[1].CreationTimestamp
	if l, _ := lease(t, env, ns, rel); l != nil {
		t.Fatalf("stock helm left a lock lease %s; the release must have no lock record", l.Name)
	}

	up := func(after time.Duration) testenv.Result {
		return env.Run(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=v3"}, flag, []string{"--recover-legacy-after", after.String()})...)
	}
	// Young by any measure: refused, naming the flag, history untouched.
	young := up(time.Hour)
	if young.ExitCode != exitcode.Pending || !strings.Contains(young.Stderr, "--recover-legacy-after") {
		t.Fatalf("upgrade of a stock-helm pending revision younger than --recover-legacy-after 1h: exit %d; want %d (pending) naming --recover-legacy-after\nstderr:\n%s",
			young.ExitCode, exitcode.Pending, young.Stderr)
	}
	if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refusal = %v; want it untouched", got)
	}
	// Around the age: refused before it, recovered after it. The
	// creationTimestamp is whole server seconds (the revision was written in
	// the second after it); the server runs on this machine, so the local
	// clock measures its age.
	untilLegacyRecovered(t, func() testenv.Result { return up(legacyAfter) }, created, created.Add(time.Second), legacyAfter,
		func() {
			if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
				t.Fatalf("history after a refusal = %v; want it untouched", got)
			}
		})
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	if d := revs[1].Description; !strings.Contains(d, "Abandoned pending-upgrade with no lock record") {
		t.Errorf("abandoned revision description = %q; want it to say it had no lock record", d)
	}
	t.Logf("abandoned revision 2: %s", revs[1].Description)
}

// legacyTryPace is how often untilLegacyRecovered tries again.
const legacyTryPace = time.Second

// untilLegacyRecovered runs try, an upgrade of a release stock helm left
// pending with --recover-legacy-after legacyAfter, again and again until it
// succeeds, and checks the outcome of each try against the revision's age,
// knowing only that the revision was written between writtenAfter and
// writtenBefore: a refusal must say pending and name the flag, and leave
// what untouched checks untouched; a try that started when the revision
// was older than legacyAfter by more than the slack of the server-time
// estimate (2 s) must not be refused; and the recovery must end no sooner
// than legacyAfter after writtenAfter (it decided no later than it ended).
// A machine however slow changes how many tries are refused, never the
// verdict.
func untilLegacyRecovered(t *testing.T, try func() testenv.Result, writtenAfter, writtenBefore time.Time, legacyAfter time.Duration, untouched func()) {
	t.Helper()
	const slack = 2 * time.Second
	limit := writtenBefore.Add(legacyAfter + 2*time.Minute)
	var refusedAt []string
	for {
		started := time.Now()
		res := try()
		ended := time.Now()
		if res.ExitCode == 0 {
			if ended.Before(writtenAfter.Add(legacyAfter)) {
				t.Fatalf("a stock-helm revision was recovered when at most %s old, before --recover-legacy-after %s\nstderr:\n%s", secs(ended.Sub(writtenAfter)), legacyAfter, res.Stderr)
			}
			figure(t, "legacy (--recover-legacy-after %s): refused at ages %s; recovered by age %s", legacyAfter, strings.Join(refusedAt, ", "), secs(ended.Sub(writtenAfter)))
			return
		}
		if res.ExitCode != exitcode.Pending || !strings.Contains(res.Stderr, "--recover-legacy-after") {
			t.Fatalf("upgrade of a stock-helm pending revision: exit %d; want 0, or %d (pending) naming --recover-legacy-after\nstderr:\n%s", res.ExitCode, exitcode.Pending, res.Stderr)
		}
		if age := started.Sub(writtenBefore); age > legacyAfter+slack {
			t.Fatalf("a stock-helm revision at least %s old was refused with --recover-legacy-after %s\nstderr:\n%s", secs(age), legacyAfter, res.Stderr)
		}
		untouched()
		refusedAt = append(refusedAt, secs(started.Sub(writtenAfter)))
		if time.Now().After(limit) {
			t.Fatalf("not recovered within 2 minutes of --recover-legacy-after %s: %d tries refused", legacyAfter, len(refusedAt))
		}
		time.Sleep(legacyTryPace) // the pace of the tries
	}
}
