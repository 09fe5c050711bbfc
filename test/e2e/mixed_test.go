package e2e

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

type auditEvent = testenv.AuditEvent

// op is one successful guarded operation of one client, by wall clock.
type op struct {
	user       string
	start, end time.Time
}

// TestMixedBackendsNeverOverlap is the mixed-client half of S1: a client
// with --lock-backend=lease and one with --lock-backend=release upgrade the
// same release over and over, at the same time. Neither may hold it while
// the other does. The evidence is the API server's audit log: for every
// operation, the span from its first to its last successful write (to the
// release's Secrets or its Lease) contains no successful write of the other
// client. The clients are told apart by impersonated user names.
func TestMixedBackendsNeverOverlap(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "mixed"
	auditLog := testenv.AuditLog()
	if _, err := os.Stat(auditLog); err != nil {
		t.Fatalf("this test reads the local cluster's audit log: %v", err)
	}
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")

	const rounds = 8
	clients := []struct{ user, backend string }{{"alice-lease", "lease"}, {"bob-release", "release"}}
	var mu sync.Mutex
	var ops []op
	refused := map[string]int{}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(3 * time.Minute)
			done := 0
			for done < rounds && time.Now().Before(deadline) {
				start := time.Now()
				res := env.Run(t, ha, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "60s",
					"--lock-backend", c.backend, "--lease-duration", "3s",
					"--kube-as-user", c.user, "--kube-as-group", "system:masters",
					"--set", "message="+c.user+start.Format("150405.000"))
				end := time.Now()
				switch res.ExitCode {
				case 0:
					done++
					mu.Lock()
					ops = append(ops, op{user: c.user, start: start, end: end})
					mu.Unlock()
				case exitcode.Locked:
					mu.Lock()
					refused[c.user]++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				default:
					t.Errorf("%s: upgrade exit %d\nstderr:\n%s", c.user, res.ExitCode, res.Stderr)
					return
				}
			}
			if done < rounds {
				t.Errorf("%s: only %d of %d upgrades succeeded in 3 minutes", c.user, done, rounds)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The audit log is written in blocking mode: every write is in it by
	// the time its response arrived.
	writes := readAuditWrites(t, auditLog, ns)
	byUser := map[string][]auditEvent{}
	for _, w := range writes {
		byUser[w.ImpersonatedUser.Username] = append(byUser[w.ImpersonatedUser.Username], w)
	}
	for _, w := range byUser["bob-release"] {
		if w.ObjectRef.Resource == "leases" {
			t.Errorf("the release-backend client wrote lease %s (%s at %s)", w.ObjectRef.Name, w.Verb, w.StageTimestamp)
		}
	}
	other := map[string]string{"alice-lease": "bob-release", "bob-release": "alice-lease"}
	checked, overlaps := 0, 0
	for _, o := range ops {
		var first, last time.Time
		secretWrites := 0
		for _, w := range byUser[o.user] {
			if w.RequestReceived.Before(o.start) || w.StageTimestamp.After(o.end) {
				continue
			}
			if first.IsZero() || w.RequestReceived.Before(first) {
				first = w.RequestReceived
			}
			if w.RequestReceived.After(last) {
				last = w.RequestReceived
			}
			if w.ObjectRef.Resource == "secrets" {
				secretWrites++
			}
		}
		if secretWrites == 0 {
			t.Errorf("%s: no successful write to the release's Secrets in the audit log for its upgrade at %s", o.user, o.start.Format(time.RFC3339Nano))
			continue
		}
		// A holder's last write is its release, and the next holder
		// writes only once it has read that release committed: after the
		// release arrived at the API server, though perhaps before its
		// answer left it (a slow response, on a loaded machine). So a
		// span runs from its first write's arrival to its last write's
		// arrival, and another client's write that arrived inside it was
		// made while this one held the release.
		for _, w := range byUser[other[o.user]] {
			if w.RequestReceived.After(first) && w.RequestReceived.Before(last) {
				overlaps++
				t.Errorf("%s wrote %s %s at %s while %s held the release (its writes span %s to %s)",
					other[o.user], w.Verb, w.ObjectRef.Name, w.StageTimestamp.Format(time.RFC3339Nano), o.user,
					first.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
			}
		}
		checked++
	}
	figure(t, "mixed backends: %d upgrades checked against %d audited writes (lease client %d, release client %d), %d refusals while the other held it, overlapping write spans: %d",
		checked, len(writes), len(byUser["alice-lease"]), len(byUser["bob-release"]), refused["alice-lease"]+refused["bob-release"], overlaps)
	if want := 2 * rounds; checked != want {
		t.Errorf("checked %d operations; want %d", checked, want)
	}
	wantHistoryLen := 1 + 2*rounds
	if revs := revisions(t, env, ns, rel); len(revs) < min(wantHistoryLen, 10) {
		t.Errorf("history has %d revisions; want at least %d", len(revs), min(wantHistoryLen, 10))
	}
}

// readAuditWrites is testenv.ReadAuditWrites, failing t on an error.
func readAuditWrites(t *testing.T, path, ns string) []auditEvent {
	t.Helper()
	out, err := testenv.ReadAuditWrites(path, ns)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
