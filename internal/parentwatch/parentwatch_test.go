package parentwatch

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv selects what the test binary does when a test starts it as a
// helper process: the grandchild whose parent the test kills.
const helperEnv = "PARENTWATCH_TEST_HELPER"

// helperLife ends a helper that outlived its test.
const helperLife = 2 * time.Minute

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

// helper runs in a process started by a shell the test kills. It prints
// "ready PID PPID" once it watches its parent, then what it saw.
func helper(mode string) int {
	ppid := os.Getppid()
	gone := make(chan struct{})
	terms := make(chan os.Signal, 1)
	switch mode {
	case "watch":
		Watch(ppid, func() { close(gone) })
	case "pidfd":
		go func() {
			if err := waitExit(ppid); err != nil {
				fmt.Printf("pidfd: %v\n", err)
				return
			}
			close(gone)
		}()
	case "poll":
		go func() {
			pollParent(ppid, PollInterval)
			close(gone)
		}()
	case "start":
		signal.Notify(terms, syscall.SIGTERM)
		Start()
	default:
		fmt.Printf("unknown mode %q\n", mode)
		return 2
	}
	fmt.Printf("ready %d %d\n", os.Getpid(), ppid)
	select {
	case <-gone:
		fmt.Println("gone")
	case <-terms:
		fmt.Println("SIGTERM")
	case <-time.After(helperLife):
		fmt.Println("timeout")
		return 1
	}
	return 0
}

// tree is a shell started by the test and the helper it started.
type tree struct {
	shell  *exec.Cmd
	lines  chan string
	helper int
	ppid   int
}

// startTree starts `sh -c 'HELPER & wait'` with the helper in mode and
// waits until the helper watches the shell.
func startTree(t *testing.T, mode string, env ...string) *tree {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	sh := exec.Command("sh", "-c", `"$0" & wait`, os.Args[0])
	sh.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	sh.Stdout = w
	sh.Stderr = os.Stderr
	if err := sh.Start(); err != nil {
		t.Fatalf("starting sh: %v", err)
	}
	_ = w.Close()
	tr := &tree{shell: sh, lines: make(chan string, 16)}
	go func() {
		defer close(tr.lines)
		defer func() { _ = r.Close() }()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			tr.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = sh.Process.Kill()
		_ = sh.Wait()
		if tr.helper > 0 {
			_ = syscall.Kill(tr.helper, syscall.SIGKILL)
		}
	})
	line := tr.next(t, 60*time.Second)
	var ready string
	if _, err := fmt.Sscan(line, &ready, &tr.helper, &tr.ppid); err != nil || ready != "ready" {
		t.Fatalf("helper said %q; want ready PID PPID", line)
	}
	if tr.ppid != sh.Process.Pid {
		t.Fatalf("the helper's parent is %d; want the shell, %d", tr.ppid, sh.Process.Pid)
	}
	return tr
}

// next returns the helper's next line, failing the test when none comes
// within limit.
func (tr *tree) next(t *testing.T, limit time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-tr.lines:
		if !ok {
			t.Fatalf("the helper closed its output without a line")
		}
		return l
	case <-time.After(limit):
		t.Fatalf("no line from the helper within %s", limit)
	}
	return ""
}

// last returns the helper's last line (it exits after it), failing the
// test when none comes within limit.
func (tr *tree) last(t *testing.T, limit time.Duration) string {
	t.Helper()
	l := tr.next(t, limit)
	tr.helper = 0 // it exits by itself now: its pid is not ours to signal
	return l
}

// killShell kills the helper's parent and reaps it.
func (tr *tree) killShell(t *testing.T) {
	t.Helper()
	if err := tr.shell.Process.Kill(); err != nil {
		t.Fatalf("killing sh: %v", err)
	}
	_ = tr.shell.Wait()
}

// TestWatchFiresWhenParentDies: a real process tree (test -> sh -> helper);
// killing the shell makes the helper's watch fire, through the pidfd on
// Linux (mode pidfd) and through getppid polling (the fallback) everywhere.
func TestWatchFiresWhenParentDies(t *testing.T) {
	modes := []string{"watch", "poll"}
	if runtime.GOOS == "linux" {
		modes = append(modes, "pidfd")
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			tr := startTree(t, mode)
			select {
			case l := <-tr.lines:
				t.Fatalf("the helper said %q while its parent was alive", l)
			default:
			}
			tr.killShell(t)
			if got := tr.last(t, 60*time.Second); got != "gone" {
				t.Fatalf("after its parent was killed the helper said %q; want gone", got)
			}
		})
	}
}

// TestStartInterruptsPlugin: Start, in a process with helm's plugin
// variables, sends the process SIGTERM after its parent died.
func TestStartInterruptsPlugin(t *testing.T) {
	tr := startTree(t, "start", EnvPluginName+"=autorecover", EnvPluginDir+"=/nowhere")
	tr.killShell(t)
	if got := tr.last(t, Grace+60*time.Second); got != "SIGTERM" {
		t.Fatalf("after its parent was killed the plugin helper said %q; want SIGTERM", got)
	}
}

// TestWatchParentGoneBeforeWatch: a ppid that is no longer this process's
// parent (the parent ended before the watch began and the pid names
// another process now) fires at once, through either path.
func TestWatchParentGoneBeforeWatch(t *testing.T) {
	other := exec.Command("sleep", "300")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = other.Process.Kill()
		_ = other.Wait()
	})
	gone := make(chan struct{})
	Watch(other.Process.Pid, func() { close(gone) })
	select {
	case <-gone:
	case <-time.After(60 * time.Second):
		t.Fatalf("watching pid %d, alive but not this process's parent, did not fire", other.Process.Pid)
	}
	if err := waitExit(other.Process.Pid); err != nil && !strings.Contains(err.Error(), "no pidfd") {
		t.Errorf("waitExit on a process that is not the parent: %v", err)
	}
}

// TestWaitExitReaped: a process that has ended and been reaped is gone at
// once (pidfd_open fails with ESRCH, or getppid names another process).
func TestWaitExitReaped(t *testing.T) {
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	Watch(c.Process.Pid, func() { close(gone) })
	select {
	case <-gone:
	case <-time.After(60 * time.Second):
		t.Fatalf("watching the reaped pid %d did not fire", c.Process.Pid)
	}
}

func TestPluginMode(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{EnvPluginName: "autorecover", EnvPluginDir: "/p"}, true},
		{map[string]string{EnvPluginName: "autorecover"}, false},
		{map[string]string{EnvPluginDir: "/p"}, false},
		{nil, false},
	} {
		if got := PluginMode(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("PluginMode(%v) = %v; want %v", tc.env, got, tc.want)
		}
	}
}

// TestWatchIgnoresNoParent: 0 and 1 are not watched (nothing to outlive).
func TestWatchIgnoresNoParent(t *testing.T) {
	for _, pid := range []int{0, 1} {
		Watch(pid, func() { t.Errorf("Watch(%s) fired", strconv.Itoa(pid)) })
	}
}
