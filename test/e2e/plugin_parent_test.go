package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// parentLimit bounds how long after helm's end the release must read
// failed, the lock be free and the plugin's process be gone: the plugin
// waits parentwatch.Grace (5 s) before it interrupts itself, and a first
// signal is handled within 5 s; the rest is room for a loaded machine.
const parentLimit = 60 * time.Second

// TestPluginParentSignalled: `helm autorecover upgrade --wait` of an
// upgrade that never becomes ready, under the real helm v4 and v3. A
// signal sent to the helm process alone (as CI runners that signal the
// job's main process do, SIGTERM or SIGINT; or SIGKILL, as the OOM killer
// does) ends helm at once; the plugin's process, whose parent helm was,
// must then end the operation as after a first signal: the revision reads
// failed, never pending, the lock is free and the process is gone. A
// SIGINT to helm's whole process group (Ctrl-C in a terminal) reaches
// both, and must end the same way: the plugin's own first signal, not
// turned into a second one (which exits at once, leaving the revision
// pending) by its parent's death.
func TestPluginParentSignalled(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	pluginDir := pluginCheckout(t, env)
	cases := []struct {
		name  string
		sig   syscall.Signal
		group bool
	}{
		{"SIGTERM to helm", syscall.SIGTERM, false},
		{"SIGINT to helm", syscall.SIGINT, false},
		{"SIGKILL to helm", syscall.SIGKILL, false},
		{"SIGINT to the process group", syscall.SIGINT, true},
	}
	for name, helm := range helms(env) {
		t.Run(name, func(t *testing.T) {
			home := installPlugin(t, env, helm, pluginDir)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					parentSignalled(t, env, ha, helm, home, c.sig, c.group)
				})
			}
		})
	}
}

func parentSignalled(t *testing.T, env *testenv.Env, ha, helm string, home []string, sig syscall.Signal, group bool) {
	ns := env.Namespace(t)
	const rel = "orphaned"
	chart := env.Chart("app")
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")

	// --timeout 5m: the upgrade cannot end by itself (helm's own timeout
	// marking it failed) within parentLimit of the signal.
	p := startGroup(t, env, home, helm, args([]string{"-n", ns, "autorecover", "upgrade", rel, chart, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriter(t, env, ns, rel, 2, 30*time.Second)
	child := procOf(t, holder.PID)
	if child.ppid != p.cmd.Process.Pid {
		t.Fatalf("the lock holder, pid %d, is a child of pid %d, not of helm (pid %d)", holder.PID, child.ppid, p.cmd.Process.Pid)
	}

	target := p.cmd.Process.Pid
	if group {
		target = -target
	}
	if err := syscall.Kill(target, sig); err != nil {
		t.Fatalf("kill(%d, %s): %v", target, sig, err)
	}
	status := p.wait(t, 30*time.Second)
	t.Logf("helm ended: %s", status)

	deadline := time.Now().Add(parentLimit)
	var failed, free, gone bool
	for (!failed || !free || !gone) && time.Now().Before(deadline) {
		revs := env.History(t, ns, rel)
		last := revs[len(revs)-1]
		failed = last.Version == 2 && last.Status == "failed"
		l, _ := lease(t, env, ns, rel)
		free = holderOf(l) == ""
		gone = child.gone()
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("helm's stderr (the plugin's too):\n%s", p.stderr(t))
	if !failed {
		t.Errorf("revision 2 did not read failed within %s of the signal; history %v", parentLimit, env.Summary(t, ns, rel))
	}
	if !free {
		l, rec := lease(t, env, ns, rel)
		t.Errorf("the lock was not free within %s of the signal: holder %q, record %+v", parentLimit, holderOf(l), rec)
	}
	if !gone {
		t.Errorf("the plugin's process (pid %d) still runs %s after helm ended", holder.PID, parentLimit)
	}
	// Never pending again, and the plugin's own session ended it.
	revs := revisions(t, env, ns, rel)
	if last := revs[len(revs)-1]; last.Revision != 2 || last.Status != "failed" {
		t.Errorf("after the plugin ended, history is\n%s", describe(revs))
	}
	if l, rec := lease(t, env, ns, rel); l != nil && rec != nil && rec.Session != holder.Session {
		t.Errorf("the lease was taken by session %s after the plugin's session %s", rec.Session, holder.Session)
	}
	if !group && !strings.Contains(p.stderr(t), "interrupted by the end of helm, its parent process") {
		t.Errorf("the plugin did not say that helm had ended")
	}
}

// groupProc is a process started in a process group of its own, with its
// output in files (so that waiting for it does not wait for the children
// that share them).
type groupProc struct {
	cmd     *exec.Cmd
	errPath string
}

// startGroup starts bin in a new process group whose id is its pid, with
// the helm folders of home.
func startGroup(t *testing.T, env *testenv.Env, home []string, bin string, a ...string) *groupProc {
	t.Helper()
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdout.Close() }()
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stderr.Close() }()
	cmd := exec.Command(bin, a...)
	cmd.Env = append(env.HelmEnv(), home...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s %v: %v", bin, a, err)
	}
	t.Logf("$ %s %s &  (pid and process group %d)", filepath.Base(bin), strings.Join(a, " "), cmd.Process.Pid)
	t.Cleanup(func() {
		// Whatever is left of the group, the plugin's process included.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if cmd.ProcessState == nil {
			_ = cmd.Wait()
		}
	})
	return &groupProc{cmd: cmd, errPath: stderr.Name()}
}

// wait waits at most limit for the process to end and describes how it did.
func (p *groupProc) wait(t *testing.T, limit time.Duration) string {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			t.Fatalf("waiting for pid %d: %v", p.cmd.Process.Pid, err)
		}
		ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exit %d", ws.ExitStatus())
	case <-time.After(limit):
		t.Fatalf("pid %d did not end within %s of the signal\nstderr:\n%s", p.cmd.Process.Pid, limit, p.stderr(t))
	}
	return ""
}

func (p *groupProc) stderr(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(p.errPath)
	if err != nil {
		t.Fatalf("reading stderr: %v", err)
	}
	return string(b)
}

// proc identifies a process by pid and start time, so that a pid reused
// by another process does not pass for it.
type proc struct {
	pid, ppid int
	start     string
}

// procOf reads the process pid from /proc; the test fails if there is none.
func procOf(t *testing.T, pid int) proc {
	t.Helper()
	state, ppid, start, err := procStat(pid)
	if err != nil || state == "Z" {
		t.Fatalf("process %d: state %q, %v", pid, state, err)
	}
	return proc{pid: pid, ppid: ppid, start: start}
}

// gone reports whether the process has ended: no such pid, a zombie
// waiting for its reaper, or another process under the same pid.
func (p proc) gone() bool {
	state, _, start, err := procStat(p.pid)
	return err != nil || state == "Z" || start != p.start
}

// procStat reads the state, parent pid and start time (fields 3, 4 and 22
// of /proc/PID/stat; the command name before them may hold spaces).
func procStat(pid int) (state string, ppid int, start string, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, "", fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", 0, "", fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0], ppid, f[19], err
}
