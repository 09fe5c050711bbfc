package e2e

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

var flagName = regexp.MustCompile(`(?m)^\s+(?:-\w, )?(--[a-z0-9-]+)`)

func flagsOf(help string) []string {
	var out []string
	for _, m := range flagName.FindAllStringSubmatch(help, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestHelmFlagParity compares our command tree with the upstream helm v4
// binary's: every helm command keeps every one of its flags, the four
// guarded commands only add the lock and recovery flags, and the others are
// unchanged.
func TestHelmFlagParity(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ours := []string{
		"--autorecover", "--lease-duration", "--lock-backend", "--lock-max-hold",
		"--lock-timeout", "--preempt", "--recover-delete-data", "--recover-legacy-after", "--recover-strategy",
	}
	guarded := map[string]bool{"install": true, "upgrade": true, "rollback": true, "uninstall": true}
	for _, cmd := range []string{
		"install", "upgrade", "rollback", "uninstall", "list", "status", "history", "get all",
		"get values", "template", "lint", "package", "pull", "push", "repo add", "dependency build",
		"plugin install", "registry login", "show values", "test", "search repo", "env", "create", "verify",
	} {
		args := append(strings.Fields(cmd), "--help")
		want := env.Run(t, env.Helm4, args...)
		got := env.Run(t, bin, args...)
		if want.ExitCode != 0 || got.ExitCode != 0 {
			t.Fatalf("%s --help: helm exit %d, ours exit %d", cmd, want.ExitCode, got.ExitCode)
		}
		wantFlags, gotFlags := flagsOf(want.Stdout), flagsOf(got.Stdout)
		if len(wantFlags) == 0 {
			t.Fatalf("%s --help: found no flags in helm's help; the parser is broken:\n%s", cmd, want.Stdout)
		}
		var missing, extra []string
		for _, f := range wantFlags {
			if !slices.Contains(gotFlags, f) {
				missing = append(missing, f)
			}
		}
		for _, f := range gotFlags {
			if !slices.Contains(wantFlags, f) {
				extra = append(extra, f)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s: helm flags missing from helm-autorecover: %v", cmd, missing)
		}
		wantExtra := []string(nil)
		if guarded[cmd] {
			wantExtra = ours
		}
		if cmd == "list" {
			wantExtra = []string{"--lock-backend", "--locks"} // --lock-backend: which locks --locks reads
		}
		if !slices.Equal(extra, wantExtra) {
			t.Errorf("%s: flags beyond helm's = %v, want %v", cmd, extra, wantExtra)
		}
	}
}
