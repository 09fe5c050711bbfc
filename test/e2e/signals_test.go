package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestFirstSignal: a first SIGINT (Ctrl-C) or SIGTERM on each of the four
// mutating operations, while helm waits, ends the process with the
// interrupted exit code, and by then the release reads failed (never
// pending) and its lock is free: the process did both before it exited,
// nobody else wrote. How soon is a figure, printed, not asserted.
func TestFirstSignal(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	for _, sg := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGINT", syscall.SIGINT}, {"SIGTERM", syscall.SIGTERM}} {
		for _, c := range opCases(env.Chart("app")) {
			t.Run(sg.name+"/"+c.name, func(t *testing.T) { firstSignal(t, env, ha, c, sg.name, sg.sig) })
		}
	}
}

// signalExitLimit is how long a signalled process may take to exit before
// the test gives up on it: generous for a loaded machine, well short of the
// operation's own --timeout (5m), which would end it without the signal.
const signalExitLimit = 2 * time.Minute

func firstSignal(t *testing.T, env *testenv.Env, ha string, c killCase, signame string, sig syscall.Signal) {
	ns := env.Namespace(t)
	const rel = "interrupted"
	if c.setup != nil {
		c.setup(t, env, ha, ns, rel)
	}
	p := env.Start(t, ha, withRelease(c.killed, rel, ns)...)
	env.WaitForStatus(t, ns, rel, c.rev, c.status, 60*time.Second)
	holder := waitForWriter(t, env, ns, rel, c.rev, 60*time.Second)
	exited := make(chan int, 1)
	go func() {
		_ = p.Cmd.Wait()
		exited <- p.Cmd.ProcessState.ExitCode()
	}()

	sentAt := time.Now()
	p.Signal(t, sig)
	// Until the process exits, note when the release first reads failed and
	// the lock first reads free (figures only).
	var failedAfter, freeAfter time.Duration
	code := -1
	limit := time.After(signalExitLimit)
	for code < 0 {
		if failedAfter == 0 {
			if revs := env.History(t, ns, rel); len(revs) > 0 && revs[len(revs)-1].Version == c.rev && revs[len(revs)-1].Status == "failed" {
				failedAfter = time.Since(sentAt)
			}
		}
		if freeAfter == 0 {
			if l, _ := lease(t, env, ns, rel); holderOf(l) == "" {
				freeAfter = time.Since(sentAt)
			}
		}
		select {
		case code = <-exited:
		case <-limit:
			_ = p.Cmd.Process.Kill()
			t.Fatalf("the process did not exit within %s of %s\nstderr:\n%s", signalExitLimit, signame, p.Stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	exitedAfter := time.Since(sentAt)
	seen := func(d time.Duration) string {
		if d == 0 {
			return "at the exit"
		}
		return "after " + d.Round(time.Millisecond).String()
	}
	figure(t, "first %s %s: failed %s, lock free %s, exit %d after %s",
		signame, c.name, seen(failedAfter), seen(freeAfter), code, exitedAfter.Round(time.Millisecond))
	t.Logf("stderr:\n%s", p.Stderr.String())
	if code != exitcode.Interrupted {
		t.Errorf("exit code %d after %s; want %d", code, signame, exitcode.Interrupted)
	}
	// Read after the exit: what the process left, with nobody else writing.
	revs := revisions(t, env, ns, rel)
	if last := revs[len(revs)-1]; last.Revision != c.rev || last.Status != "failed" {
		t.Errorf("when the process had exited after %s, history is\n%s", signame, describe(revs))
	}
	if l, rec := lease(t, env, ns, rel); holderOf(l) != "" {
		t.Errorf("when the process had exited after %s, the lock was still held: holder %q, record %+v", signame, holderOf(l), rec)
	} else if l != nil && rec != nil && rec.Session != holder.Session {
		t.Errorf("the lease was taken by session %s after the interrupted holder %s", rec.Session, holder.Session)
	}
}

// TestSecondSignal: a second SIGINT ends the process at once, whatever the
// first one set in motion; the lease then expires and the next operation
// recovers the release.
func TestSecondSignal(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	for _, c := range opCases(env.Chart("app")) {
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "interrupted"
			if c.setup != nil {
				c.setup(t, env, ha, ns, rel)
			}
			p := env.Start(t, ha, withRelease(c.killed, rel, ns)...)
			env.WaitForStatus(t, ns, rel, c.rev, c.status, 60*time.Second)
			waitForWriter(t, env, ns, rel, c.rev, 10*time.Second)

			// Back to back, so the second lands while the first is handled
			// (helm cancelling, or the guard marking the release failed).
			p.Signal(t, syscall.SIGINT)
			secondAt := time.Now()
			// The first signal may have ended it already (it is not reaped
			// yet, so the signal still finds it).
			_ = p.Cmd.Process.Signal(syscall.SIGINT)
			// Ended by the second signal: the operation's own --timeout
			// (5m) is far beyond this limit.
			code := p.Wait(t, signalExitLimit)
			took := time.Since(secondAt)
			left := env.Summary(t, ns, rel)
			figure(t, "second SIGINT %s: exit %d after %s (history left: %v)", c.name, code, took.Round(time.Millisecond), left)
			if code != exitcode.Interrupted {
				t.Errorf("exit code %d after two SIGINTs; want %d\nstderr:\n%s", code, exitcode.Interrupted, p.Stderr.String())
			}

			exitedAt := time.Now()
			res := env.Run(t, ha, withRelease(c.recover, rel, ns)...)
			if res.ExitCode != 0 {
				t.Fatalf("%s after the second signal: exit %d\nstderr:\n%s\nhistory: %v", c.recover[0], res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
			}
			figure(t, "after second SIGINT %s: next %s succeeded %s after the exit (lease %s)", c.name, c.recover[0], secs(time.Since(exitedAt)), killLease)
			for _, r := range revisions(t, env, ns, rel) {
				if strings.HasPrefix(string(r.Status), "pending") || r.Status == "uninstalling" {
					t.Errorf("revision %d is still %s after recovery", r.Revision, r.Status)
				}
			}
		})
	}
}

// TestSecondSignalStalledAPI: a second SIGINT ends the process at once even
// while the first one's clean-up (marking the release failed, releasing the
// lock) hangs on an API server that stopped answering. Afterwards the lease
// expires and the next operation recovers the release.
func TestSecondSignalStalledAPI(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	// A lease long enough that the holder's own fail-stop (renew deadline =
	// lease - 1 s after the last renewal) does not end it first.
	const stallLease = 12 * time.Second
	for _, c := range opCases(env.Chart("app")) {
		// Install and uninstall share these two paths: helm handles the
		// first signal (then the guard after a grace period), or the guard
		// does at once.
		if c.name != "upgrade" && c.name != "rollback" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "stalled"
			if c.setup != nil {
				c.setup(t, env, ha, ns, rel)
			}
			proxy, kubeconfig := startStallProxy(t, env)
			a := args(withRelease(c.killed, rel, ns), []string{"--kubeconfig", kubeconfig, "--lease-duration", stallLease.String()})
			p := env.Start(t, ha, a...)
			env.WaitForStatus(t, ns, rel, c.rev, c.status, 60*time.Second)
			waitForWriter(t, env, ns, rel, c.rev, 10*time.Second)
			exited := make(chan int, 1)
			go func() {
				_ = p.Cmd.Wait()
				exited <- p.Cmd.ProcessState.ExitCode()
			}()

			proxy.Stall()
			p.Signal(t, syscall.SIGINT)
			// The guard's own clean-up starts (after its grace for helm's
			// handling of the signal, for upgrade) and hangs on the stalled
			// API server; it says so before its first request.
			limit := time.After(signalExitLimit)
			for !strings.Contains(p.Stderr.String(), guard.CleanupStarted) {
				select {
				case code := <-exited:
					t.Fatalf("the process ended (exit %d) before its clean-up started, while its API server was stalled; the scenario needs it stuck in clean-up\nstderr:\n%s", code, p.Stderr.String())
				case <-limit:
					t.Fatalf("the guard's clean-up did not start within %s of the first SIGINT (no %q on stderr)\nstderr:\n%s", signalExitLimit, guard.CleanupStarted, p.Stderr.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			secondAt := time.Now()
			p.Signal(t, syscall.SIGINT)
			// Ended by the second signal: the stalled API server never
			// answers, and the operation's --timeout (5m) is far beyond this.
			var code int
			select {
			case code = <-exited:
			case <-time.After(signalExitLimit):
				t.Fatalf("the process did not exit within %s of the second SIGINT\nstderr:\n%s", signalExitLimit, p.Stderr.String())
			}
			took := time.Since(secondAt)
			figure(t, "second SIGINT with stalled API %s: exit %d after %s", c.name, code, took.Round(time.Millisecond))
			if code != exitcode.Interrupted {
				t.Errorf("exit code %d; want %d\nstderr:\n%s", code, exitcode.Interrupted, p.Stderr.String())
			}
			// The clean-up never finished: the second signal ended it.
			if strings.Contains(p.Stderr.String(), "the release is marked failed and its lock released") {
				t.Errorf("the clean-up finished although the API server was stalled; the second signal's path was not taken\nstderr:\n%s", p.Stderr.String())
			}

			left := env.Summary(t, ns, rel)
			exitedAt := time.Now()
			res := env.Run(t, ha, args(withRelease(c.recover, rel, ns), []string{"--lock-timeout", "60s"})...)
			if res.ExitCode != 0 {
				t.Fatalf("%s after the second signal: exit %d\nstderr:\n%s\nhistory: %v", c.recover[0], res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
			}
			figure(t, "after stalled second SIGINT %s: left %v; next %s succeeded %s after the exit (lease %s)",
				c.name, left, c.recover[0], secs(time.Since(exitedAt)), stallLease)
			for _, r := range revisions(t, env, ns, rel) {
				if strings.HasPrefix(string(r.Status), "pending") || r.Status == "uninstalling" {
					t.Errorf("revision %d is still %s after recovery", r.Revision, r.Status)
				}
			}
		})
	}
}
