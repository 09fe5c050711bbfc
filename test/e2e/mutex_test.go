package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestTwoLiveClients is invariant S1: while one upgrade holds the lock, a
// second fails at once (without waiting) with the locked exit code and names
// the holder; with --lock-timeout it waits instead and takes the lock the
// holder released, before the holder's LOCKED TILL (woken by the release,
// not by the lock running out). The latencies are figures.
func TestTwoLiveClients(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "mutex"
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")

	// The holder waits for pods that never schedule and gives up by itself
	// after its --timeout: its revision ends failed and it releases the lock.
	// Its lease is longer than the waiter's --lock-timeout: a waiter not
	// woken by the release gives up before the lock could run out.
	const holderTimeout = 15 * time.Second
	holder := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", holderTimeout.String(), "--lease-duration", "2m", "--set", "message=holder"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	rec := waitForWriter(t, env, ns, rel, 2, 10*time.Second)
	watch := watchLease(t, env, ns, rel)

	// A second live client fails at once, naming the holder.
	res := env.Run(t, ha, "upgrade", rel, chart, "-n", ns, "--set", "message=second")
	figure(t, "locked-failure latency: %s (exit %d)", res.Elapsed.Round(time.Millisecond), res.ExitCode)
	if res.ExitCode != exitcode.Locked {
		t.Fatalf("second upgrade: exit %d; want %d (locked)\nstderr:\n%s", res.ExitCode, exitcode.Locked, res.Stderr)
	}
	if strings.Contains(res.Stderr, "waiting for the lock") {
		t.Errorf("second upgrade waited for the lock without --lock-timeout:\n%s", res.Stderr)
	}
	for _, want := range []string{rec.Session, rec.Who, "upgrade", "LOCKED TILL", "--lock-timeout"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("second upgrade's stderr does not contain %q:\n%s", want, res.Stderr)
		}
	}
	if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refused upgrade = %v; want it untouched", got)
	}

	// A waiter queues and runs as soon as the holder is done.
	waiter := env.Start(t, ha, "upgrade", rel, chart, "-n", ns, "--lock-timeout", "60s", "--set", "message=waiter")
	if code := holder.Wait(t, 2*time.Minute); code != 1 {
		t.Fatalf("holder: exit %d; want 1 (its wait timed out)\nstderr:\n%s", code, holder.Stderr.String())
	}
	if code := waiter.Wait(t, time.Minute); code != 0 {
		t.Fatalf("waiter: exit %d\nstderr:\n%s", code, waiter.Stderr.String())
	}
	if !strings.Contains(waiter.Stderr.String(), "waiting for the lock held by") || !strings.Contains(waiter.Stderr.String(), rec.Session) {
		t.Errorf("waiter's stderr shows no progress naming the holder %s:\n%s", rec.Session, waiter.Stderr.String())
	}
	// The watch delivers the release and the take (it may lag the
	// processes' exits).
	var events []leaseEvent
	var released, taken leaseEvent
	for deadline := time.Now().Add(time.Minute); ; {
		events = watch.snapshot()
		var okR, okT bool
		released, okR = firstEvent(events, func(e leaseEvent) bool { return e.holder == "" && e.rec != nil && e.rec.Session == rec.Session })
		taken, okT = firstEvent(events, func(e leaseEvent) bool {
			return okR && e.holder != "" && e.holder != rec.Session && e.rec != nil && !e.at.Before(released.at)
		})
		if okT {
			break
		}
		if time.Now().After(deadline) {
			if !okR {
				t.Fatalf("never saw the holder (session %s) release the lock; events: %v", rec.Session, holders(events))
			}
			t.Fatalf("never saw the waiter take the lock after the release; events: %v", holders(events))
		}
		time.Sleep(20 * time.Millisecond)
	}
	figure(t, "waiter start after release: %s (holder session %s, waiter session %s)", taken.at.Sub(released.at).Round(time.Millisecond), rec.Session, taken.holder)
	// Woken by the release itself, not by the holder's lock running out:
	// taken (in server time, the upper bound of the waiter's estimate)
	// before the LOCKED TILL the holder last wrote.
	till := rec.LockedTill
	for _, e := range events {
		if e.holder == rec.Session && e.rec != nil && e.rec.LockedTill.After(till) {
			till = e.rec.LockedTill
		}
	}
	if acq := taken.rec.AcquiredAt; !acq.Before(till) {
		t.Errorf("the waiter took the lock at %v, not before the holder's LOCKED TILL %v: not woken by the release", acq, till)
	}
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	if strings.Contains(revs[1].Description, "Abandoned") {
		t.Errorf("the holder's own failed revision was recovered by someone else: %q", revs[1].Description)
	}
}

// firstEvent returns the first event that satisfies pred.
func firstEvent(events []leaseEvent, pred func(leaseEvent) bool) (leaseEvent, bool) {
	for _, e := range events {
		if pred(e) {
			return e, true
		}
	}
	return leaseEvent{}, false
}

// holders lists the holder of each event, for failure messages.
func holders(events []leaseEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = string(e.typ) + ":" + e.holder
	}
	return out
}

// TestTwoLiveClientsReleaseBackend is the refusal and the wait of
// TestTwoLiveClients with --lock-backend=release: the lock is on the pending
// revision's own record.
func TestTwoLiveClientsReleaseBackend(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "mutex-release"
	flag := []string{"--lock-backend", "release"}
	mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, flag)...)
	holder := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "15s", "--set", "message=holder"}, unschedulable, flag)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	rec := waitForWriterIn(t, env, recordLock, ns, rel, 2, 10*time.Second)

	res := env.Run(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=second"}, flag)...)
	figure(t, "locked-failure latency (--lock-backend=release): %s (exit %d)", res.Elapsed.Round(time.Millisecond), res.ExitCode)
	if res.ExitCode != exitcode.Locked {
		t.Fatalf("second upgrade: exit %d; want %d (locked)\nstderr:\n%s", res.ExitCode, exitcode.Locked, res.Stderr)
	}
	if strings.Contains(res.Stderr, "waiting for the lock") {
		t.Errorf("second upgrade waited for the lock without --lock-timeout:\n%s", res.Stderr)
	}
	for _, want := range []string{rec.Session, rec.Who, "upgrade", "LOCKED TILL"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("second upgrade's stderr does not contain %q:\n%s", want, res.Stderr)
		}
	}
	// A lease-backend client is refused by the same lock.
	res = env.Run(t, ha, "upgrade", rel, chart, "-n", ns, "--set", "message=lease", "--lock-backend", "lease")
	if res.ExitCode != exitcode.Locked || !strings.Contains(res.Stderr, rec.Session) {
		t.Fatalf("lease-backend upgrade while a release-backend client holds: exit %d; want %d naming %s\nstderr:\n%s", res.ExitCode, exitcode.Locked, rec.Session, res.Stderr)
	}
	if got := env.Summary(t, ns, rel); strings.Join(got, " ") != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refused upgrades = %v; want it untouched", got)
	}
	// The lock on the record is visible to the lock commands, with no Lease.
	for _, c := range [][]string{{"locks", rel, "-n", ns, "-o", "json"}, {"list", "--locks", "-n", ns}} {
		res := env.Run(t, ha, c...)
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, rec.Session) {
			t.Errorf("%s: exit %d; want the record lock's session %s in\n%s%s", strings.Join(c[:2], " "), res.ExitCode, rec.Session, res.Stdout, res.Stderr)
		}
		var rows []struct {
			State   string `json:"lock_state"`
			Session string `json:"session_id"`
		}
		if c[0] == "locks" && (json.Unmarshal([]byte(res.Stdout), &rows) != nil || len(rows) != 1 || rows[0].State != "live" || rows[0].Session != rec.Session) {
			t.Errorf("locks: the record lock is not shown live:\n%s", res.Stdout)
		}
	}

	waiter := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--lock-timeout", "60s", "--set", "message=waiter"}, flag)...)
	if code := holder.Wait(t, 2*time.Minute); code != 1 {
		t.Fatalf("holder: exit %d; want 1 (its wait timed out)\nstderr:\n%s", code, holder.Stderr.String())
	}
	heldUntil := time.Now()
	if code := waiter.Wait(t, time.Minute); code != 0 {
		t.Fatalf("waiter: exit %d\nstderr:\n%s", code, waiter.Stderr.String())
	}
	figure(t, "waiter done after the holder exited (--lock-backend=release, includes the waiter's upgrade): %s", time.Since(heldUntil).Round(time.Millisecond))
	if !strings.Contains(waiter.Stderr.String(), "waiting for the lock held by") {
		t.Errorf("waiter's stderr shows no progress:\n%s", waiter.Stderr.String())
	}
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	if strings.Contains(revs[1].Description, "Abandoned") {
		t.Errorf("the holder's own failed revision was recovered by someone else: %q", revs[1].Description)
	}
}

// TestConcurrentFirstInstalls is S1 before any revision exists: three
// clients install the same new release at once, with each backend. With
// release there is no record to lock yet, so the create of revision 1
// decides: one wins and the others fail with the locked exit code, having
// written nothing; with lease the Lease decides before helm starts.
func TestConcurrentFirstInstalls(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	for _, backend := range []string{"release", "lease"} {
		t.Run(backend, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "first"
			procs := make([]*testenv.Proc, 3)
			for i := range procs {
				procs[i] = env.Start(t, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s",
					"--lock-backend", backend, "--set", "message=client"+strings.Repeat("x", i))
			}
			won, refused := 0, 0
			for i, p := range procs {
				switch code := p.Wait(t, 2*time.Minute); code {
				case 0:
					won++
				case exitcode.Locked:
					refused++
					if !strings.Contains(p.Stderr.String(), rel) || !strings.Contains(p.Stderr.String(), "locked") {
						t.Errorf("client %d: the refusal does not say the release is locked:\n%s", i, p.Stderr.String())
					}
				default:
					t.Errorf("client %d: exit %d; want 0 or %d\nstderr:\n%s", i, code, exitcode.Locked, p.Stderr.String())
				}
			}
			figure(t, "3 concurrent first installs (--lock-backend=%s): %d succeeded, %d refused with exit 3", backend, won, refused)
			if won != 1 || refused != 2 {
				t.Errorf("%d installs succeeded and %d were refused; want exactly 1 and 2", won, refused)
			}
			wantHistory(t, env, ns, rel, "1:deployed")
		})
	}
}
