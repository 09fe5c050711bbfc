package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// guardFlagCompletions are the values completed for the guard's enumerated
// flags.
var guardFlagCompletions = map[string][]string{
	"--lock-backend":     {"auto", "lease", "release"},
	"--recover-strategy": {"fail", "rollback"},
}

// TestPluginCompleteGuardFlags: the binary completes the values of
// --lock-backend and --recover-strategy on the four guarded commands, each
// with a description. No cluster needed.
func TestPluginCompleteGuardFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ha := (&testenv.Env{RepoRoot: testenv.RepoRoot()}).Bin(t)
	for _, cmd := range []string{"install", "upgrade", "rollback", "uninstall"} {
		for flag, want := range guardFlagCompletions {
			out, err := exec.Command(ha, "__complete", cmd, flag, "").Output()
			if err != nil {
				t.Fatalf("%s __complete %s %s '': %v", ha, cmd, flag, err)
			}
			checkCompletions(t, cmd+" "+flag, string(out), want)
		}
	}
	// The lock commands take --lock-backend too (and recover
	// --recover-strategy).
	for _, args := range [][]string{{"locks", "--lock-backend"}, {"unlock", "--lock-backend"}, {"recover", "--lock-backend"}, {"list", "--lock-backend"}, {"recover", "--recover-strategy"}} {
		out, err := exec.Command(ha, "__complete", args[0], args[1], "").Output()
		if err != nil {
			t.Fatalf("%s __complete %s %s '': %v", ha, args[0], args[1], err)
		}
		checkCompletions(t, args[0]+" "+args[1], string(out), guardFlagCompletions[args[1]])
	}
	// A prefix narrows the choice.
	out, err := exec.Command(ha, "__complete", "upgrade", "--lock-backend", "re").Output()
	if err != nil {
		t.Fatal(err)
	}
	checkCompletions(t, "upgrade --lock-backend re", string(out), []string{"release"})
}

// checkCompletions checks cobra's __complete output: exactly the values
// want, each with a description, and no file completion.
func checkCompletions(t *testing.T, what, out string, want []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || lines[len(lines)-1] != ":4" {
		t.Errorf("%s: completion does not end with :4 (no file completion):\n%s", what, out)
		return
	}
	var got []string
	for _, l := range lines[:len(lines)-1] {
		value, desc, ok := strings.Cut(l, "\t")
		if !ok || desc == "" {
			t.Errorf("%s: %q has no description", what, l)
		}
		got = append(got, value)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s: completes %v; want %v", what, got, want)
	}
}

// TestPluginCompletion: under the real helm v4 and v3, `helm __complete
// autorecover ...` (what the shell completion scripts run) completes
// through the plugin's plugin.complete with the binary's own completions:
// release names of the namespace (-n before or after the plugin's name),
// held releases for unlock and their session for --session, and the
// values of the guard's flags.
func TestPluginCompletion(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	pluginDir := pluginCheckout(t, env)
	ns := env.Namespace(t)
	const rel = "completed"
	chart := env.Chart("app")
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
	// A holder that died leaves the lock held (and soon expired): unlock's
	// completion lists such releases only.
	p := env.Start(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriter(t, env, ns, rel, 2, 30*time.Second)
	p.Kill(t)

	for name, helm := range helms(env) {
		t.Run(name, func(t *testing.T) {
			home := installPlugin(t, env, helm, pluginDir)
			complete := func(a ...string) string {
				t.Helper()
				res := env.RunEnv(t, home, helm, append([]string{"__complete"}, a...)...)
				if res.ExitCode != 0 {
					t.Fatalf("helm __complete %v: exit %d: %s%s", a, res.ExitCode, res.Stdout, res.Stderr)
				}
				return res.Stdout
			}
			for _, a := range [][]string{
				{"-n", ns, "autorecover", "locks", ""},
				{"autorecover", "locks", "-n", ns, ""},
				{"-n", ns, "autorecover", "unlock", ""},
				{"-n", ns, "autorecover", "recover", "comp"},
			} {
				out := complete(a...)
				if !strings.Contains(out, rel+"\t") || !strings.HasSuffix(strings.TrimSpace(out), ":4") {
					t.Errorf("helm __complete %s does not list release %s:\n%s", strings.Join(a, " "), rel, out)
				}
			}
			out := complete("-n", ns, "autorecover", "unlock", rel, "--session", "")
			if !strings.Contains(out, holder.Session+"\t") {
				t.Errorf("helm __complete autorecover unlock %s --session '' does not list session %s:\n%s", rel, holder.Session, out)
			}
			for flag, want := range guardFlagCompletions {
				checkCompletions(t, "helm autorecover upgrade "+flag, complete("-n", ns, "autorecover", "upgrade", rel, chart, flag, ""), want)
			}
		})
	}
}
