package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	yamlutil "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// TestOneVersionEverywhere (issue 35 item 7): the four places a user reads
// the project's version show one string, internal/version.Version, word for
// word: `helm-autorecover version` of the binary `make build` makes (with
// the commit beside it), `helm plugin list` under helm v3 and v4 (from
// plugin.yaml), the toolVersion of the lock record an operation writes, and
// the chart's version and appVersion.
func TestOneVersionEverywhere(t *testing.T) {
	want := version.Version
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(want) {
		t.Fatalf("internal/version.Version is %q; want a semantic version without a leading v (the form plugin.yaml and Chart.yaml need)", want)
	}
	if got := pluginVersion(t); got != want {
		t.Errorf("plugin.yaml version is %q; want %q (internal/version.Version)", got, want)
	}
	raw, err := os.ReadFile(filepath.Join(chartDir(testenv.RepoRoot()), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yamlutil.Unmarshal(raw, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart.Version != want || chart.AppVersion != want {
		t.Errorf("Chart.yaml version %q, appVersion %q; want both %q (internal/version.Version)", chart.Version, chart.AppVersion, want)
	}

	env := testenv.Get(t)
	// The binary as `make build` stamps it (the Makefile's LDFLAGS).
	bin := filepath.Join(t.TempDir(), "helm-autorecover")
	cmd := exec.Command("make", "build", "BIN="+bin)
	cmd.Dir = env.RepoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	res := env.Run(t, bin, "version")
	line, _, _ := strings.Cut(res.Stdout, "\n")
	if m := regexp.MustCompile(`^helm-autorecover (\S+) \(commit "([0-9a-f]{7,}(-dirty)?)"`).FindStringSubmatch(line); res.ExitCode != 0 || m == nil || m[1] != want {
		t.Errorf("helm-autorecover version (make build): exit %d, first line %q; want \"helm-autorecover %s (commit \\\"<commit>\\\", ...\"\n%s", res.ExitCode, line, want, res.Stderr)
	}

	plugin := pluginRelease(t, env)
	copyFile(t, bin, filepath.Join(plugin, "bin", "helm-autorecover"), 0o755)
	for name, helm := range helms(env) {
		home := installPlugin(t, env, helm, plugin)
		res := env.RunEnv(t, home, helm, "plugin", "list")
		var got string
		for _, l := range strings.Split(res.Stdout, "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "autorecover" {
				got = f[1]
			}
		}
		if res.ExitCode != 0 || got != want {
			t.Errorf("%s plugin list: exit %d, autorecover at version %q; want %q\n%s%s", name, res.ExitCode, got, want, res.Stdout, res.Stderr)
		}
	}

	ns := env.Namespace(t)
	const rel = "versioned"
	if res := env.Run(t, bin, "upgrade", "--install", rel, env.Chart("app"), "-n", ns); res.ExitCode != 0 {
		t.Fatalf("upgrade --install: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if _, rec := lease(t, env, ns, rel); rec == nil || rec.ToolVersion != want {
		t.Errorf("lock record of %s/%s: %+v; want toolVersion %q", ns, rel, rec, want)
	}
}
