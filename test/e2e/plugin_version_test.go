package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// TestPluginVersion: plugin.yaml's version is the project's version
// (internal/version.Version without its "v"), so that `helm plugin list`
// names what is installed. Bump both together. No cluster needed.
func TestPluginVersion(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("plugin.yaml has no version line:\n%s", data)
	}
	if got, want := string(m[1]), strings.TrimPrefix(version.Version, "v"); got != want {
		t.Errorf("plugin.yaml version is %q; internal/version.Version is %q: set plugin.yaml's to %q", got, version.Version, want)
	}
}
