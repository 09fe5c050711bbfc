package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsageNamesTheProgramAsInvoked: usage lines name the binary as its
// user called it, as a plugin of helm or on its own, never plain helm; the
// root's help opens with what this tool adds.
func TestUsageNamesTheProgramAsInvoked(t *testing.T) {
	help := func(args ...string) string {
		var out, errOut bytes.Buffer
		if code := Run(&out, &errOut, args); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, errOut.String())
		}
		return out.String()
	}
	t.Setenv("HELM_PLUGIN_NAME", "")
	if got := help("locks", "--help"); !strings.Contains(got, "helm-autorecover locks [RELEASE]") {
		t.Errorf("locks --help on its own:\n%s", got)
	}
	t.Setenv("HELM_PLUGIN_NAME", "autorecover")
	t.Setenv("HELM_PLUGIN_DIR", t.TempDir())
	if got := help("unlock", "--help"); !strings.Contains(got, "helm autorecover unlock RELEASE") {
		t.Errorf("unlock --help as a plugin:\n%s", got)
	}
	got := help("--help")
	if !strings.HasPrefix(got, "helm-autorecover is helm with locked, self-recovering releases.") ||
		!strings.Contains(got, "The Kubernetes package manager") || !strings.Contains(got, "helm autorecover [command]") {
		t.Errorf("--help as a plugin does not open with what this tool adds, then helm's text:\n%s", got)
	}
}
