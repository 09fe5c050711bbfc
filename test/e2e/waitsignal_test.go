package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestSignalWhileWaiting interrupts a client that waits (--lock-timeout)
// behind a live holder: it must leave the waiters' queue at once, exit with
// the interrupted code and write nothing; the holder is not disturbed.
func TestSignalWhileWaiting(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "waiter"
	chart := env.Chart("app")
	mustRun(t, env, bin, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")

	holder := env.Start(t, bin, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "2m",
		"--set", "nodeSelector.never=matches", "--lease-duration", "6s")
	rec := waitForWriter(t, env, ns, rel, 2, 60*time.Second)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)

	waiter := env.Start(t, bin, "upgrade", rel, chart, "-n", ns, "--set", "message=waiter", "--lock-timeout", "2m")
	deadline := time.Now().Add(30 * time.Second)
	for !queued(queues(t, env, ns, rel)) {
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never queued (on the release record or the Lease); stderr:\n%s", waiter.Stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	waiter.Signal(t, syscall.SIGINT)
	sent := time.Now()
	if code := waiter.Wait(t, 10*time.Second); code != exitcode.Interrupted {
		t.Fatalf("interrupted waiter exit code = %d, want %d; stderr:\n%s", code, exitcode.Interrupted, waiter.Stderr.String())
	}
	figure(t, "interrupted waiter exit: %s", time.Since(sent).Round(time.Millisecond))
	l, now := lease(t, env, ns, rel)
	if q := queues(t, env, ns, rel); queued(q) {
		t.Fatalf("the interrupted waiter is still queued: %s", q)
	}
	if holderOf(l) != rec.Session {
		t.Fatalf("holder changed from %s to %q (record %+v)", rec.Session, holderOf(l), now)
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history = %s; the interrupted waiter must write nothing", got)
	}
	holder.Signal(t, syscall.SIGINT)
	holder.Wait(t, 15*time.Second)
}
