package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// killLease is the lease of the operations these tests kill. The recovering
// operation succeeds once the dead holder's lock expired, within its
// --lock-timeout; how soon after the kill is a figure the tests print and
// make bench measures (recovery: at most lease + 2 s), not an assertion:
// on a loaded machine a wall-clock bound flakes.
const killLease = 3 * time.Second

// killCase is one mutating operation killed with SIGKILL while it waits, and
// the operation that must then recover the release by itself.
type killCase struct {
	name string
	// setup brings the release to the state the killed operation starts from.
	setup func(t *testing.T, env *testenv.Env, ha, ns, rel string)
	// killed is the operation to kill; it ends up writing revision rev as
	// status and then waits for ever.
	killed []string
	rev    int
	status string
	// recover is the next operation, run at once with --lock-timeout so it
	// waits for the dead holder's lock to expire instead of failing.
	recover []string
	// history is the expected history afterwards ("" when none is kept).
	history string
}

// TestKillRecovers is invariant S2: after the holder of each of the four
// mutating operations dies by SIGKILL while helm waits, the next operation
// succeeds with no human step as soon as the dead holder's lock has expired
// (at most lease + 2 s after the kill), history keeps every revision, and
// the abandoned one reads failed with a description naming the dead
// holder's session (after upgrade --install from a failed first revision,
// helm itself then marks it superseded; the description stays).
func TestKillRecovers(t *testing.T) {
	killRecovers(t, "lease", leaseLock)
}

// TestKillRecoversReleaseBackend is TestKillRecovers with the lock on the
// release's own records (--lock-backend=release): no Lease is ever written.
func TestKillRecoversReleaseBackend(t *testing.T) {
	killRecovers(t, "release", recordLock)
}

func killRecovers(t *testing.T, backend string, read lockReader) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	cases := opCases(env.Chart("app"))
	flag := []string{"--lock-backend", backend}
	// Sequential on purpose: the figure is a latency bound, and the machine
	// is small.
	// Each holder is killed after it renewed at least once, as in real life;
	// one upgrade is also killed as soon as its pending revision is seen,
	// while its estimate of server time (and so its LOCKED TILL) is still
	// the least precise.
	early := cases[0]
	early.name = "upgrade-killed-at-once"
	cases = append(cases, early)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "killed"
			sub := func(a []string) []string { return withRelease(args(a, flag), rel, ns) }
			if c.setup != nil {
				c.setup(t, env, ha, ns, rel)
			}

			p := env.Start(t, ha, sub(c.killed)...)
			env.WaitForStatus(t, ns, rel, c.rev, c.status, 60*time.Second)
			holder := waitForWriterIn(t, env, read, ns, rel, c.rev, 10*time.Second)
			if c.name != early.name {
				waitRenewed(t, func(a ...string) testenv.Result { return env.Run(t, ha, a...) }, ns, rel, holder.Session)
			}
			killAt := time.Now()
			p.Kill(t)

			res := env.Run(t, ha, sub(c.recover)...)
			took := time.Since(killAt)
			if res.ExitCode != 0 {
				t.Fatalf("%s after the kill: exit %d\nstderr:\n%s\nhistory: %v", c.recover[0], res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
			}
			figure(t, "kill-to-success %s (--lock-backend=%s): %s (lease %s)", c.name, backend, secs(took), killLease)
			if !strings.Contains(res.Stderr, "recovered") || !strings.Contains(res.Stderr, holder.Session) {
				t.Errorf("stderr of the recovering %s does not report the recovery of session %s:\n%s", c.recover[0], holder.Session, res.Stderr)
			}

			revs := wantHistory(t, env, ns, rel, c.history)
			if c.history != "" {
				abandoned(t, revs[c.rev-1], c.status, holder.Session)
				t.Logf("abandoned revision %d: %s", c.rev, revs[c.rev-1].Description)
				waitLockFreeIn(t, env, read, ns, rel, 5*time.Second)
				if backend == "release" {
					// (setup ran with the default backend and may have.)
					if l, lr := lease(t, env, ns, rel); l != nil && lr != nil && lr.Session == holder.Session {
						t.Errorf("--lock-backend=release wrote lease %s (session %s)", l.Name, lr.Session)
					}
				}
				return
			}
			// A complete uninstall keeps nothing, its lock included (with
			// the release backend the lock went with the records; a Lease
			// the setup's default-backend install left is not its to delete).
			if h, rec := recordLock(t, env, ns, rel); h != "" || rec != nil {
				t.Errorf("a release record with a lock is left after the uninstall: holder %q, record %+v", h, rec)
			}
			if l, lr := lease(t, env, ns, rel); l != nil && (backend == "lease" || (lr != nil && lr.Session == holder.Session)) {
				t.Errorf("lease %s still exists after the uninstall: holder %q", l.Name, holderOf(l))
			}
		})
	}
}

// waitRenewed waits until session, holding the lock of rel, has renewed it:
// the LOCKED TILL that `helm-autorecover locks` shows has moved on from the
// first one read, whichever store holds the lock. run runs the binary
// (with the environment of the release's storage driver).
func waitRenewed(t *testing.T, run func(args ...string) testenv.Result, ns, rel, session string) {
	t.Helper()
	till := func() time.Time {
		res := run("locks", rel, "-n", ns, "-o", "json")
		var rows []struct {
			Session    string    `json:"session_id"`
			LockedTill time.Time `json:"locked_till"`
		}
		if res.ExitCode != 0 || json.Unmarshal([]byte(res.Stdout), &rows) != nil || len(rows) != 1 || rows[0].Session != session {
			t.Fatalf("locks %s -n %s -o json: exit %d; want one row held by session %s\n%s%s", rel, ns, res.ExitCode, session, res.Stdout, res.Stderr)
		}
		return rows[0].LockedTill
	}
	first := till()
	for deadline := time.Now().Add(time.Minute); !till().After(first); {
		if time.Now().After(deadline) {
			t.Fatalf("session %s did not renew the lock of %s/%s within a minute (LOCKED TILL still %v)", session, ns, rel, first)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// opCases are the four mutating operations, each held open for ever by
// pods or a hook that never schedule, with the operation that follows it.
func opCases(chart string) []killCase {
	leaseFlag := []string{"--lease-duration", killLease.String()}
	return []killCase{
		{
			name: "upgrade",
			setup: func(t *testing.T, env *testenv.Env, ha, ns, rel string) {
				mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
			},
			killed:  args([]string{"upgrade", "REL", chart, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable, leaseFlag),
			rev:     2,
			status:  "pending-upgrade",
			recover: []string{"upgrade", "REL", chart, "--lock-timeout", "30s", "--set", "message=v3"},
			history: "1:superseded 2:failed 3:deployed",
		},
		{
			name:    "install",
			killed:  args([]string{"install", "REL", chart, "--wait", "--timeout", "5m"}, unschedulable, leaseFlag),
			rev:     1,
			status:  "pending-install",
			recover: []string{"upgrade", "--install", "REL", chart, "--lock-timeout", "30s", "--set", "message=v2"},
			// Helm's upgrade supersedes the failed revision it upgrades
			// from when none is deployed; the description stays.
			history: "1:superseded 2:deployed",
		},
		{
			name: "rollback",
			setup: func(t *testing.T, env *testenv.Env, ha, ns, rel string) {
				// Revision 1 deploys (no --wait) pods that never schedule;
				// revision 2 is good. Rolling back to 1 with --wait hangs.
				mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns}, unschedulable)...)
				// (A value is set so that helm does not reuse revision 1's.)
				mustRun(t, env, ha, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "60s", "--set", "message=v2")
			},
			killed:  args([]string{"rollback", "REL", "1", "--wait", "--timeout", "5m"}, leaseFlag),
			rev:     3,
			status:  "pending-rollback",
			recover: []string{"rollback", "REL", "2", "--lock-timeout", "30s"},
			history: "1:superseded 2:superseded 3:failed 4:deployed",
		},
		{
			name: "uninstall",
			setup: func(t *testing.T, env *testenv.Env, ha, ns, rel string) {
				// A pre-delete hook whose pod never schedules holds the
				// uninstall open in "uninstalling".
				mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, hookUnschedulable)...)
				// The uninstalling write must fall in a later server second
				// than the install: recovery reads an uninstall's start from
				// managedFields time and treats one equal to the
				// creationTimestamp as unknown (reported to the recovery
				// package's owner).
				time.Sleep(1100 * time.Millisecond)
			},
			killed: args([]string{"uninstall", "REL", "--timeout", "5m"}, leaseFlag),
			rev:    1,
			status: "uninstalling",
			// The hook would hang again: the user skips it this time.
			recover: []string{"uninstall", "REL", "--no-hooks", "--lock-timeout", "30s"},
			history: "",
		},
	}
}

// withRelease puts the release name in place of REL and adds the namespace.
func withRelease(a []string, rel, ns string) []string {
	out := make([]string, 0, len(a)+2)
	for _, s := range a {
		out = append(out, strings.ReplaceAll(s, "REL", rel))
	}
	return append(out, "-n", ns)
}
