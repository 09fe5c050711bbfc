package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestFrozenClocksHolderStopsAfterTakeover (issue 31, item 3): a holder
// whose clocks stand still while the world goes on (a VM stopped and
// resumed, a memory snapshot or CRIU image restored: monotonic and boot
// time alike) must not write after another client took its release over.
// The chaos build stops the holder right after helm wrote its pending
// revision, and once it is continued its clocks read as if no time had
// passed (HELM_AUTORECOVER_CHAOS_FREEZE_AT). Meanwhile its lease runs out
// in the API server's clock, and another client takes the release over and
// upgrades it. The resumed holder must exit with the lock-lost code and
// make no write: by the audit log, nothing its user wrote (release
// records, its Lease, the chart's ConfigMap, which helm applies first) was
// received after it was continued. By its own clocks its lock is still
// valid; only the API server's clock, read from the first answer it gets,
// tells it otherwise.
func TestFrozenClocksHolderStopsAfterTakeover(t *testing.T) {
	env := testenv.Get(t)
	bin := env.ChaosBin(t)
	ns := env.Namespace(t)
	auditLog := testenv.AuditLog()
	if _, err := os.Stat(auditLog); err != nil {
		t.Fatalf("this test reads the local cluster's audit log: %v", err)
	}
	const rel = "frozen"
	chart := env.Chart("app")
	lease := []string{"--lease-duration", "6s"}
	dir := t.TempDir()
	holderUser := "frozen-holder-" + ns
	holderKC := impersonatingKubeconfig(t, env, dir, holderUser)

	mustRun(t, env, bin, append([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, lease...)...)
	holder := env.StartEnv(t, []string{"KUBECONFIG=" + holderKC, "HELM_AUTORECOVER_CHAOS_FREEZE_AT=after-pending-write"}, bin,
		append([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=holder", "--timeout", "2m"}, lease...)...)
	waitProcStopped(t, holder, time.Minute)
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history while the holder is stopped = %s, want 1:deployed 2:pending-upgrade", got)
	}
	stopped := time.Now()

	// The world goes on: the holder's lease runs out in the server's clock
	// and another client takes the release over.
	res := env.Run(t, bin, append([]string{"upgrade", rel, chart, "-n", ns, "--set", "message=taker", "--lock-timeout", "60s"}, lease...)...)
	if res.ExitCode != 0 {
		t.Fatalf("the taker's upgrade while the holder is stopped: exit %d: %s", res.ExitCode, res.Stderr)
	}
	const want = "1:superseded 2:failed 3:deployed"
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != want {
		t.Fatalf("history after the takeover = %s, want %s", got, want)
	}

	continued := time.Now()
	holder.Signal(t, syscall.SIGCONT)
	code := holder.Wait(t, time.Minute)
	figure(t, "frozen holder: stopped %s; continued to exit %s", secs(continued.Sub(stopped)), secs(time.Since(continued)))
	t.Logf("the resumed holder's stderr:\n%s", holder.Stderr.String())
	if strings.Contains(holder.Stderr.String(), "not renewed before its renew deadline") {
		t.Errorf("the resumed holder stopped at its renew deadline on its own clocks: they did not stand still while it was stopped, and the test proves nothing")
	}
	if code != exitcode.LockLost {
		t.Errorf("the resumed holder's exit code = %d, want %d (lock lost); stderr:\n%s", code, exitcode.LockLost, holder.Stderr.String())
	}
	writes, err := testenv.ReadAuditWritesOf(auditLog, ns, "secrets", "configmaps", "leases")
	if err != nil {
		t.Fatal(err)
	}
	var late []string
	for _, e := range writes {
		if e.ImpersonatedUser.Username == holderUser && !e.RequestReceived.Before(continued) {
			late = append(late, fmt.Sprintf("%s %s/%s at %s", e.Verb, e.ObjectRef.Resource, e.ObjectRef.Name, e.RequestReceived.Format("15:04:05.000")))
		}
	}
	if len(late) > 0 {
		t.Errorf("the resumed holder wrote after the takeover: %s", strings.Join(late, ", "))
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != want {
		t.Errorf("history after the holder exited = %s, want %s", got, want)
	}
	cm := env.Client.CoreV1().ConfigMaps(ns)
	if c, err := cm.Get(t.Context(), rel+"-config", metav1.GetOptions{}); err != nil || c.Data["message"] != "taker" {
		t.Errorf("the chart's ConfigMap after the holder exited: %v, %v; want the taker's message", c.Data, err)
	}
}

// waitProcStopped waits until p has stopped itself (state T in
// /proc/PID/stat), failing the test when it exits first or timeout passes.
func waitProcStopped(t *testing.T, p *testenv.Proc, timeout time.Duration) {
	t.Helper()
	pid := p.Cmd.Process.Pid
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatalf("pid %d exited before stopping itself: %v\nstderr:\n%s", pid, err, p.Stderr.String())
		}
		// pid (comm) STATE ...: comm may hold spaces and parentheses.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
			switch s[i+2] {
			case 'T':
				return
			case 'Z':
				t.Fatalf("pid %d exited before stopping itself\nstderr:\n%s", pid, p.Stderr.String())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not stop itself within %s\nstderr:\n%s", pid, timeout, p.Stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
