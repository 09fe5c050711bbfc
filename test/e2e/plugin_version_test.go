package e2e

import (
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// TestPluginVersion: plugin.yaml's version is the project's version
// (internal/version.Version without its "v"), so that `helm plugin list`
// names what is installed. Bump both together. No cluster needed.
func TestPluginVersion(t *testing.T) {
	if got, want := pluginVersion(t), strings.TrimPrefix(version.Version, "v"); got != want {
		t.Errorf("plugin.yaml version is %q; internal/version.Version is %q: set plugin.yaml's to %q", got, version.Version, want)
	}
}
