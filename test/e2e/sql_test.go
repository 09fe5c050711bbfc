package e2e

import (
	"database/sql"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// sqlCase is one release kept by helm's sql driver in a fresh database of
// the real local PostgreSQL server.
type sqlCase struct {
	env   *testenv.Env
	ha    string
	chart string
	ns    string
	extra []string
	dsn   string
}

func newSQLCase(t *testing.T) sqlCase {
	env := testenv.Get(t)
	dsn := env.Postgres(t)
	return sqlCase{
		env: env, ha: env.Bin(t), chart: env.Chart("app"), ns: env.Namespace(t), dsn: dsn,
		extra: []string{"HELM_DRIVER=sql", "HELM_DRIVER_SQL_CONNECTION_STRING=" + dsn},
	}
}

func (c sqlCase) history(t *testing.T, rel string) func() []string {
	return func() []string { return testenv.SQLHistory(t, c.dsn, c.ns, rel) }
}

// install installs rel with helm-autorecover, and extra flags.
func (c sqlCase) install(t *testing.T, rel string, extra ...string) {
	t.Helper()
	if res := c.run(t, c.ha, append([]string{"install", rel, c.chart, "-n", c.ns, "--wait", "--timeout", "60s"}, extra...)...); res.ExitCode != 0 {
		t.Fatalf("install: exit %d: %s", res.ExitCode, res.Stderr)
	}
}

func (c sqlCase) run(t *testing.T, bin string, a ...string) testenv.Result {
	t.Helper()
	return c.env.RunEnv(t, c.extra, bin, a...)
}

func (c sqlCase) wantHistory(t *testing.T, rel, want string) {
	t.Helper()
	if got := strings.Join(c.history(t, rel)(), " "); got != want {
		t.Fatalf("history of %s/%s in the database = %s, want %s", c.ns, rel, got, want)
	}
}

// TestSQLKillRecovers is invariant S2 with HELM_DRIVER=sql: a guarded
// upgrade killed by SIGKILL while helm waits leaves its revision pending in
// the database; the next upgrade waits out the dead holder's lock, marks the
// revision failed naming its session, and succeeds, whichever backend is
// named (with sql each takes the row in the database, then the Lease).
func TestSQLKillRecovers(t *testing.T) {
	for _, backend := range []string{"release", "lease"} {
		t.Run(backend, func(t *testing.T) {
			c := newSQLCase(t)
			const rel = "sqlkilled"
			flag := []string{"-n", c.ns, "--lock-backend", backend, "--lease-duration", killLease.String()}
			c.install(t, rel, flag[2:]...)
			p := c.env.StartEnv(t, c.extra, c.ha, args(append([]string{"upgrade", rel, c.chart, "--wait", "--timeout", "5m", "--set", "message=v2"}, flag...), unschedulable)...)
			testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 2, "pending-upgrade", 60*time.Second)
			c.waitRenewed(t, rel) // as in real life
			killAt := time.Now()
			p.Kill(t)

			res := c.run(t, c.ha, append([]string{"upgrade", rel, c.chart, "--lock-timeout", "30s", "--set", "message=v3"}, flag...)...)
			if res.ExitCode != 0 {
				t.Fatalf("upgrade after the kill: exit %d\nstderr:\n%s\nhistory: %v", res.ExitCode, res.Stderr, c.history(t, rel)())
			}
			figure(t, "kill-to-success sql (--lock-backend=%s): %s (lease %s)", backend, secs(time.Since(killAt)), killLease)
			if !strings.Contains(res.Stderr, "recovered") {
				t.Errorf("the recovering upgrade does not report a recovery:\n%s", res.Stderr)
			}
			c.wantHistory(t, rel, "1:superseded 2:failed 3:deployed")
			// helm itself reads the recovered history.
			h := c.run(t, c.env.Helm4, "history", rel, "-n", c.ns)
			if h.ExitCode != 0 || !strings.Contains(h.Stdout, "failed") {
				t.Fatalf("helm history after recovery: exit %d\n%s%s", h.ExitCode, h.Stdout, h.Stderr)
			}
		})
	}
}

// TestSQLFailStopAfterPause is invariant S5 with HELM_DRIVER=sql: a holder
// frozen (SIGSTOP) past its lease is recovered by another client; thawed, it
// exits with the lock-lost code, and the database holds no write of it
// after the takeover.
func TestSQLFailStopAfterPause(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqlfrozen"
	flag := []string{"-n", c.ns, "--lease-duration", "3s"}
	c.install(t, rel, flag[2:]...)
	holder := c.env.StartEnv(t, c.extra, c.ha, append([]string{"upgrade", rel, c.chart, "--wait", "--timeout", "5m", "--set", "nodeSelector.never=matches"}, flag...)...)
	testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 2, "pending-upgrade", 60*time.Second)
	holder.Signal(t, syscall.SIGSTOP)

	res := c.run(t, c.ha, append([]string{"upgrade", rel, c.chart, "--set", "message=v3", "--lock-timeout", "30s"}, flag...)...)
	if res.ExitCode != 0 {
		t.Fatalf("recovering upgrade while the holder is frozen: exit %d: %s", res.ExitCode, res.Stderr)
	}
	const want = "1:superseded 2:failed 3:deployed"
	c.wantHistory(t, rel, want)

	holder.Signal(t, syscall.SIGCONT)
	if code := holder.Wait(t, 30*time.Second); code != exitcode.LockLost {
		t.Fatalf("thawed holder exit code = %d, want %d (lock lost); stderr:\n%s", code, exitcode.LockLost, holder.Stderr.String())
	}
	c.wantHistory(t, rel, want)
}

// TestSQLLegacyStuckRelease is invariant S6 with HELM_DRIVER=sql: a
// revision stock helm left pending (no lock session wrote it) is recovered
// only once it has been pending for --recover-legacy-after, measured in the
// database's clock, and refused before.
func TestSQLLegacyStuckRelease(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqllegacy"
	const legacyAfter = 15 * time.Second
	c.install(t, rel)
	// The pending revision is written between these two instants, and
	// stamped in whole seconds: its age may count from up to a second before
	// started (the database runs on this machine: the local clock measures
	// its age).
	started := time.Now().Add(-time.Second)
	p := c.env.StartEnv(t, c.extra, c.env.Helm4, args([]string{"upgrade", rel, c.chart, "-n", c.ns, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable)...)
	testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)
	killed := time.Now()

	up := func(after time.Duration) testenv.Result {
		return c.run(t, c.ha, "upgrade", rel, c.chart, "-n", c.ns, "--set", "message=v3", "--recover-legacy-after", after.String())
	}
	// Young by any measure: refused, naming the flag, history untouched.
	if res := up(time.Hour); res.ExitCode != exitcode.Pending || !strings.Contains(res.Stderr, "--recover-legacy-after") {
		t.Fatalf("upgrade of a stock-helm pending revision younger than --recover-legacy-after 1h: exit %d, want %d naming --recover-legacy-after\nstderr:\n%s", res.ExitCode, exitcode.Pending, res.Stderr)
	}
	c.wantHistory(t, rel, "1:deployed 2:pending-upgrade")
	// Around the age: refused before it, recovered after it.
	untilLegacyRecovered(t, func() testenv.Result { return up(legacyAfter) }, started, killed, legacyAfter,
		func() { c.wantHistory(t, rel, "1:deployed 2:pending-upgrade") })
	c.wantHistory(t, rel, "1:superseded 2:failed 3:deployed")
}

// TestSQLTwoLiveClients is invariant S1 with HELM_DRIVER=sql: of two
// upgrades started together, one waits for the other (--lock-timeout), and
// the history shows them one after the other, each deployed in turn.
func TestSQLTwoLiveClients(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqlmutex"
	c.install(t, rel)
	up := func(msg string) *testenv.Proc {
		return c.env.StartEnv(t, c.extra, c.ha, "upgrade", rel, c.chart, "-n", c.ns, "--wait", "--timeout", "60s", "--lock-timeout", "90s", "--set", "message="+msg)
	}
	a, b := up("a"), up("b")
	ca, cb := a.Wait(t, 150*time.Second), b.Wait(t, 150*time.Second)
	if ca != 0 || cb != 0 {
		t.Fatalf("two upgrades: exit %d and %d\nstderr a:\n%s\nstderr b:\n%s", ca, cb, a.Stderr.String(), b.Stderr.String())
	}
	c.wantHistory(t, rel, "1:superseded 2:superseded 3:deployed")
}

// TestSQLUnlockForce: with HELM_DRIVER=sql, `unlock --force` of a killed
// holder's session releases both its lock row and its Lease, whichever
// backend is named, recovers what it left pending, and the next upgrade
// needs no wait.
func TestSQLUnlockForce(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqlunlock"
	c.install(t, rel)
	p := c.env.StartEnv(t, c.extra, c.ha, args([]string{"upgrade", rel, c.chart, "-n", c.ns, "--wait", "--timeout", "5m", "--lease-duration", "5s", "--set", "message=v2"}, unschedulable)...)
	testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)
	session := c.holder(t, rel)
	res := c.run(t, c.ha, "unlock", rel, "-n", c.ns, "--session", session, "--force", "--yes", "--lock-backend", "release")
	if res.ExitCode != 0 {
		t.Fatalf("unlock --force: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	c.wantHistory(t, rel, "1:deployed 2:failed")
	if res := c.run(t, c.ha, "upgrade", rel, c.chart, "-n", c.ns, "--set", "message=v3"); res.ExitCode != 0 {
		t.Fatalf("upgrade after unlock --force (no --lock-timeout): exit %d: %s", res.ExitCode, res.Stderr)
	}
	c.wantHistory(t, rel, "1:superseded 2:failed 3:deployed")
}

// waitRenewed waits until the holder of the release's lock row has renewed
// its lock.
func (c sqlCase) waitRenewed(t *testing.T, rel string) {
	t.Helper()
	waitRenewed(t, func(a ...string) testenv.Result { return c.run(t, c.ha, a...) }, c.ns, rel, c.holder(t, rel))
}

// holder is the session the release's lock row names.
func (c sqlCase) holder(t *testing.T, rel string) string {
	t.Helper()
	db, err := sql.Open("postgres", c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var h string
	if err := db.QueryRow(`SELECT holder FROM helm_autorecover_locks_v1 WHERE namespace = $1 AND release = $2`, c.ns, rel).Scan(&h); err != nil || h == "" {
		t.Fatalf("the lock row of %s/%s: holder %q, %v", c.ns, rel, h, err)
	}
	return h
}

// TestSQLKilledRollbackOnFailureRecovers is TestKilledRollbackOnFailureRecovers
// with HELM_DRIVER=sql: the rollback's row, written by the killed holder's
// session under the lock row that names the upgrade's revision, is that
// holder's, and the next upgrade recovers it with --recover-legacy-after 0.
func TestSQLKilledRollbackOnFailureRecovers(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqlrof"
	flag := []string{"-n", c.ns, "--lock-backend", "release", "--lease-duration", killLease.String()}
	// Revision 1's pods never schedule: the rollback to it waits for ever.
	if res := c.run(t, c.ha, args([]string{"install", rel, c.chart}, flag, unschedulable)...); res.ExitCode != 0 {
		t.Fatalf("install: exit %d: %s", res.ExitCode, res.Stderr)
	}
	p := c.env.StartEnv(t, c.extra, c.ha, args([]string{"upgrade", rel, c.chart, "--rollback-on-failure", "--wait", "--timeout", "5m"}, flag, unschedulable, failingUpgrade)...)
	testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 3, "pending-rollback", 60*time.Second)
	c.waitRenewed(t, rel) // as in real life
	killAt := time.Now()
	p.Kill(t)

	res := c.run(t, c.ha, append([]string{"upgrade", rel, c.chart, "--lock-timeout", "30s", "--set", "message=v3", "--recover-legacy-after", "0"}, flag...)...)
	if res.ExitCode != 0 {
		t.Fatalf("upgrade after the kill: exit %d\nstderr:\n%s\nhistory: %v", res.ExitCode, res.Stderr, c.history(t, rel)())
	}
	figure(t, "kill-to-success sql rollback-on-failure: %s (lease %s)", secs(time.Since(killAt)), killLease)
	c.wantHistory(t, rel, "1:superseded 2:failed 3:failed 4:deployed")
}

// TestSQLController: the controller serves a cluster whose helm keeps its
// releases with the sql driver. It polls helm's database, leaves a live
// holder's pending revision alone while it renews, and once that holder is
// killed and its lock row expired, recovers the revision (marked failed)
// and, with --recover-strategy=rollback, rolls back through helm's sql
// driver under its own lock row; the next upgrade then needs no wait.
func TestSQLController(t *testing.T) {
	c := newSQLCase(t)
	const rel = "sqlctl"
	flag := []string{"-n", c.ns, "--lease-duration", killLease.String()}
	c.install(t, rel, flag[2:]...)
	p := c.env.StartEnv(t, c.extra, c.ha, args(append([]string{"upgrade", rel, c.chart, "--wait", "--timeout", "5m", "--set", "message=v2"}, flag...), unschedulable)...)
	testenv.WaitForLatest(t, c.ns+"/"+rel, c.history(t, rel), 2, "pending-upgrade", 60*time.Second)
	c.waitRenewed(t, rel)

	// helm's rows carry no labels of their own: a selector is refused
	// rather than ignored.
	if res := c.run(t, c.ha, "controller", "--namespaces", c.ns, "--leader-elect=false", "--selector", "team=payments"); res.ExitCode != exitcode.Usage || !strings.Contains(res.Stderr, "--selector") {
		t.Fatalf("controller --helm-driver=sql --selector: exit %d, want %d naming --selector:\n%s", res.ExitCode, exitcode.Usage, res.Stderr)
	}
	ctl := startControllerEnv(t, c.env, c.extra, "--namespaces", c.ns, "--leader-elect=false", "--sql-poll-interval", "1s", "--recover-strategy", "rollback")
	// Polled and judged live: left alone while its holder renews.
	deadline := time.Now().Add(2 * time.Minute)
	for ctl.metric(t, "helm_autorecover_pending_releases", `state="live"`) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the controller never judged the live holder's pending release; history %v", c.history(t, rel)())
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.waitRenewed(t, rel)
	c.wantHistory(t, rel, "1:deployed 2:pending-upgrade")

	p.Kill(t)
	want := "1:superseded 2:failed 3:deployed"
	deadline = time.Now().Add(2 * time.Minute)
	for strings.Join(c.history(t, rel)(), " ") != want {
		if time.Now().After(deadline) {
			t.Fatalf("not recovered and rolled back by the controller: history %v, want %s", c.history(t, rel)(), want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := recoveredEvents(t, c.env, c.ns, 1, time.Minute); n < 1 {
		t.Errorf("no Recovered Event from the controller")
	}
	res := c.run(t, c.ha, append([]string{"upgrade", rel, c.chart, "--set", "message=v4"}, flag...)...)
	if res.ExitCode != 0 {
		t.Fatalf("upgrade after the controller's recovery: exit %d\n%s", res.ExitCode, res.Stderr)
	}
	c.wantHistory(t, rel, "1:superseded 2:failed 3:superseded 4:deployed")
}
