package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestFailStopAfterPause freezes a holder (SIGSTOP) for longer than its
// lease, lets another client recover the release, then thaws the holder: it
// must notice it lost the lock and exit with ExitLockLost before writing
// anything, so the recovered history stays as the recoverer left it.
func TestFailStopAfterPause(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "frozen"
	chart := env.Chart("app")
	lease := []string{"--lease-duration", "3s"}

	if res := env.Run(t, bin, append([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, lease...)...); res.ExitCode != 0 {
		t.Fatalf("install: %s", res.Stderr)
	}
	holder := env.Start(t, bin, append([]string{
		"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
		"--set", "nodeSelector.never=matches",
	}, lease...)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder.Signal(t, syscall.SIGSTOP)
	paused := time.Now()

	res := env.Run(t, bin, append([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=v3", "--lock-timeout", "30s"}, lease...)...)
	if res.ExitCode != 0 {
		t.Fatalf("recovering upgrade while the holder is frozen: exit %d: %s", res.ExitCode, res.Stderr)
	}
	t.Logf("FIGURE pause-to-recovered: %s (lease 3s)", time.Since(paused).Round(10*time.Millisecond))
	want := "1:superseded 2:failed 3:deployed"
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != want {
		t.Fatalf("history after recovery = %s, want %s", got, want)
	}

	holder.Signal(t, syscall.SIGCONT)
	thawed := time.Now()
	code := holder.Wait(t, 20*time.Second)
	if code != exitcode.LockLost {
		t.Fatalf("thawed holder exit code = %d, want %d (lock lost); stderr:\n%s", code, exitcode.LockLost, holder.Stderr.String())
	}
	t.Logf("FIGURE thaw-to-exit: %s", time.Since(thawed).Round(10*time.Millisecond))
	if !strings.Contains(holder.Stderr.String(), "lost the lock") {
		t.Fatalf("thawed holder stderr does not explain the loss:\n%s", holder.Stderr.String())
	}
	// Not a synchronisation: nothing can be waited for here. A write the
	// holder sent just before it exited may still be in the API server's
	// hands; a second lets it land, so that it is seen. (Without it the test
	// cannot fail wrongly, only miss such a write.)
	time.Sleep(time.Second)
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != want {
		t.Fatalf("history after the thawed holder exited = %s, want %s (it wrote after losing its lock)", got, want)
	}
	revs := env.History(t, ns, rel)
	if revs[2].Secret.Labels["status"] != "deployed" {
		t.Fatalf("revision 3 = %s, want deployed", revs[2].Secret.Labels["status"])
	}
}
