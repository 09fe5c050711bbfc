package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// recipes reads the scripts of docs/ci.md: each fenced block right after a
// <!-- recipe: NAME --> marker.
func recipes(t *testing.T, env *testenv.Env) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(env.RepoRoot, "docs", "ci.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)<!-- recipe: ([a-z]+) -->\n```sh\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		out[m[1]] = m[2]
	}
	for _, name := range []string{"deploy", "loop"} {
		if out[name] == "" {
			t.Fatalf("docs/ci.md has no recipe %q", name)
		}
	}
	return out
}

// recipeRun is one run of a recipe's script.
type recipeRun struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
}

// startRecipe runs script with bash in its own process group (as a CI
// runner runs a job), helm-autorecover on its PATH, and vars set.
func startRecipe(t *testing.T, env *testenv.Env, script string, vars ...string) *recipeRun {
	t.Helper()
	f := filepath.Join(t.TempDir(), "recipe.sh")
	if err := os.WriteFile(f, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &recipeRun{cmd: exec.Command("bash", f), done: make(chan struct{})}
	r.cmd.Env = append(env.HelmEnv(), "PATH="+filepath.Dir(env.Bin(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	r.cmd.Env = append(r.cmd.Env, vars...)
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("$ %s bash recipe.sh &  (pid %d)", strings.Join(vars, " "), r.cmd.Process.Pid)
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	})
	return r
}

// wait returns the script's exit code, failing the test after limit.
func (r *recipeRun) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(limit):
		t.Fatalf("the recipe did not end within %s\nstdout:\n%s\nstderr:\n%s", limit, r.stdout.String(), r.stderr.String())
	}
	return r.cmd.ProcessState.ExitCode()
}

func runRecipe(t *testing.T, env *testenv.Env, script string, vars ...string) (int, *recipeRun) {
	t.Helper()
	r := startRecipe(t, env, script, vars...)
	return r.wait(t, 5*time.Minute), r
}

// TestCIRecipes (issue 15 item 4): the commands of docs/ci.md, as a
// pipeline runs them: a first deploy; a deploy refused (exit 3) while
// another holds the lock past LOCK_TIMEOUT; after that holder is killed
// outright, a deploy that waits, recovers its revision and deploys; a
// cancelled deploy (SIGINT to the job's process group) that exits 130 and
// leaves the lock free; the shell loop, retrying on exit 3 until a
// holder is done; and a deploy stopped (exit 11) by a newer one run with
// HELM_AUTORECOVER_PREEMPT=true.
func TestCIRecipes(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	ns := env.Namespace(t)
	chart := env.Chart("app")
	rs := recipes(t, env)
	const rel = "shop"
	vars := []string{"RELEASE=" + rel, "CHART=" + chart, "NAMESPACE=" + ns}

	// A first deploy installs.
	if code, r := runRecipe(t, env, rs["deploy"], vars...); code != 0 || !strings.Contains(r.stdout.String(), "deployed "+rel) {
		t.Fatalf("first deploy: exit %d\n%s%s", code, r.stdout.String(), r.stderr.String())
	}

	// Another client holds the lock (held open by pods that never
	// schedule): the deploy gives up after LOCK_TIMEOUT with exit 3.
	holder := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	waitForWriter(t, env, ns, rel, 2, 10*time.Second)
	code, r := runRecipe(t, env, rs["deploy"], append(vars, "LOCK_TIMEOUT=2s")...)
	if code != exitcode.Locked || !strings.Contains(r.stderr.String(), "still locked by another deploy") {
		t.Fatalf("deploy against a live holder: exit %d; want %d\n%s", code, exitcode.Locked, r.stderr.String())
	}

	// The holder is killed outright: the next deploy waits for its lock to
	// expire, recovers revision 2 and deploys revision 3.
	holder.Kill(t)
	if code, r := runRecipe(t, env, rs["deploy"], vars...); code != 0 {
		t.Fatalf("deploy after a killed holder: exit %d\n%s", code, r.stderr.String())
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")

	// A cancelled deploy: SIGINT to the job's process group while helm
	// waits. It exits 130, the revision failed, the lock free: the next
	// deploy does not wait (LOCK_TIMEOUT=1s would refuse it otherwise).
	job := startRecipe(t, env, rs["deploy"], append(vars, "HELM_ARGS=--set nodeSelector.never=matches")...)
	env.WaitForStatus(t, ns, rel, 4, "pending-upgrade", 60*time.Second)
	waitForWriter(t, env, ns, rel, 4, 10*time.Second)
	if err := syscall.Kill(-job.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := job.wait(t, 2*time.Minute); code != exitcode.Interrupted || !strings.Contains(job.stderr.String(), "cancelled") {
		t.Fatalf("cancelled deploy: exit %d; want %d\n%s", code, exitcode.Interrupted, job.stderr.String())
	}
	if code, r := runRecipe(t, env, rs["deploy"], append(vars, "LOCK_TIMEOUT=1s")...); code != 0 {
		t.Fatalf("deploy after a cancelled one: exit %d\n%s", code, r.stderr.String())
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:superseded 4:failed 5:deployed")

	// The loop: a holder that gives up by itself after its --timeout; the
	// loop is refused (exit 3) until then, and deploys once it is done.
	holder = env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "10s"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 6, "pending-upgrade", 60*time.Second)
	waitForWriter(t, env, ns, rel, 6, 10*time.Second)
	code, r = runRecipe(t, env, rs["loop"], append(vars, "LOCK_TIMEOUT=1s", "ATTEMPTS=200")...)
	if code != 0 || !strings.Contains(r.stderr.String(), "attempt 1: exit 3, trying again") {
		t.Fatalf("the loop: exit %d\n%s", code, r.stderr.String())
	}
	if code := holder.Wait(t, time.Minute); code != 1 {
		t.Errorf("the holder: exit %d; want 1 (its wait timed out)", code)
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:superseded 4:failed 5:superseded 6:failed 7:deployed")

	// --preempt, as the recipes of "Cancelling a running deploy" set it
	// (HELM_AUTORECOVER_PREEMPT): a deploy held in its --wait is stopped
	// by a newer one; the older exits 11 and says it was superseded, the
	// newer deploys, and the older's revision reads failed.
	older := startRecipe(t, env, rs["deploy"], append(vars, "HELM_ARGS=--set nodeSelector.never=matches")...)
	env.WaitForStatus(t, ns, rel, 8, "pending-upgrade", 60*time.Second)
	waitForWriter(t, env, ns, rel, 8, 10*time.Second)
	if code, r := runRecipe(t, env, rs["deploy"], append(vars, "HELM_AUTORECOVER_PREEMPT=true")...); code != 0 {
		t.Fatalf("the preempting deploy: exit %d\n%s", code, r.stderr.String())
	}
	if code := older.wait(t, 2*time.Minute); code != exitcode.Preempted || !strings.Contains(older.stderr.String(), "stopped: a newer deploy") {
		t.Fatalf("the preempted deploy: exit %d; want %d\n%s", code, exitcode.Preempted, older.stderr.String())
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:superseded 4:failed 5:superseded 6:failed 7:superseded 8:failed 9:deployed")
}
