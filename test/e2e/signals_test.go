package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// signalBound is how soon after a first SIGINT the release must read failed
// and its lock be free.
const signalBound = 5 * time.Second

// TestFirstSignal: a first SIGINT (Ctrl-C) or SIGTERM on each of the four
// mutating operations, while helm waits, ends the release failed (never
// pending) and frees the lock within 5 s, and the process ends with the
// interrupted exit code.
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

func firstSignal(t *testing.T, env *testenv.Env, ha string, c killCase, signame string, sig syscall.Signal) {
	ns := env.Namespace(t)
	const rel = "interrupted"
	if c.setup != nil {
		c.setup(t, env, ha, ns, rel)
	}
	p := env.Start(t, ha, withRelease(c.killed, rel, ns)...)
	env.WaitForStatus(t, ns, rel, c.rev, c.status, 60*time.Second)
	holder := waitForWriter(t, env, ns, rel, c.rev, 10*time.Second)

	sentAt := time.Now()
	p.Signal(t, sig)
	var failedAfter, freeAfter time.Duration
	for failedAfter == 0 || freeAfter == 0 {
		if time.Since(sentAt) > signalBound+5*time.Second {
			break
		}
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
		time.Sleep(20 * time.Millisecond)
	}
	code := p.Wait(t, 30*time.Second)
	exitedAfter := time.Since(sentAt)
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	figure(t, "first %s %s: failed after %s, lock free after %s, exit %d after %s",
		signame, c.name, ms(failedAfter), ms(freeAfter), code, ms(exitedAfter))
	t.Logf("stderr:\n%s", p.Stderr.String())
	if failedAfter == 0 || failedAfter > signalBound {
		t.Errorf("revision %d did not read failed within %s of %s; history %v", c.rev, signalBound, signame, env.Summary(t, ns, rel))
	}
	if freeAfter == 0 || freeAfter > signalBound {
		l, rec := lease(t, env, ns, rel)
		t.Errorf("the lock was not free within %s of %s: holder %q, record %+v", signalBound, signame, holderOf(l), rec)
	}
	if code != exitcode.Interrupted {
		t.Errorf("exit code %d after %s; want %d", code, signame, exitcode.Interrupted)
	}
	// Never pending again: nothing rewrote it after the process ended.
	revs := revisions(t, env, ns, rel)
	if last := revs[len(revs)-1]; last.Revision != c.rev || last.Status != "failed" {
		t.Errorf("after the process ended, history is\n%s", describe(revs))
	}
	if l, rec := lease(t, env, ns, rel); l != nil && rec != nil && rec.Session != holder.Session {
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
			code := p.Wait(t, 30*time.Second)
			took := time.Since(secondAt)
			left := env.Summary(t, ns, rel)
			figure(t, "second SIGINT %s: exit %d after %s (history left: %v)", c.name, code, took.Round(time.Millisecond), left)
			if code != exitcode.Interrupted {
				t.Errorf("exit code %d after two SIGINTs; want %d\nstderr:\n%s", code, exitcode.Interrupted, p.Stderr.String())
			}
			// At once, not after helm's --timeout or the API's stall.
			if took > 30*time.Second {
				t.Errorf("the process took %s to exit after the second SIGINT; want at once", took.Round(time.Millisecond))
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
			// Past the guard's 3 s grace for helm's own handling, into the
			// guard's clean-up, which now hangs.
			time.Sleep(4 * time.Second)
			select {
			case code := <-exited:
				t.Fatalf("the process ended (exit %d) while its API server was stalled; the scenario needs it stuck in clean-up\nstderr:\n%s", code, p.Stderr.String())
			default:
			}
			secondAt := time.Now()
			p.Signal(t, syscall.SIGINT)
			var code int
			select {
			case code = <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("the process did not exit within 30s of the second SIGINT\nstderr:\n%s", p.Stderr.String())
			}
			took := time.Since(secondAt)
			figure(t, "second SIGINT with stalled API %s: exit %d after %s", c.name, code, took.Round(time.Millisecond))
			if code != exitcode.Interrupted {
				t.Errorf("exit code %d; want %d\nstderr:\n%s", code, exitcode.Interrupted, p.Stderr.String())
			}
			// At once, not after helm's --timeout or the API's stall.
			if took > 30*time.Second {
				t.Errorf("the process took %s to exit after the second SIGINT; want at once", took.Round(time.Millisecond))
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
