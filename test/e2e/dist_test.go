package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestPluginInstallsFromArchive (issue 15 item 3): on a machine without Go
// (PATH without it) and outside a source checkout, the plugin's install
// hook takes this machine's archive (make dist, hack/dist.sh) from a local
// folder or an HTTP server named by HELM_AUTORECOVER_DIST, checks it
// against checksums.txt, and the plugin runs; an archive whose checksum
// does not match installs nothing and says so.
func TestPluginInstallsFromArchive(t *testing.T) {
	env := testenv.Get(t)
	dist := t.TempDir()
	cmd := exec.Command(filepath.Join(env.RepoRoot, "hack", "dist.sh"))
	cmd.Env = append(os.Environ(), "DIST_DIR="+dist, "DIST_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH, "DIST_BINARY="+env.Bin(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/dist.sh: %v\n%s", err, out)
	}
	tampered := t.TempDir()
	for _, f := range []string{"checksums.txt", "helm-autorecover_" + pluginVersion(t) + "_" + runtime.GOOS + "_" + runtime.GOARCH + ".tar.gz"} {
		copyFile(t, filepath.Join(dist, f), filepath.Join(tampered, f), 0o644)
	}
	sums, err := os.ReadFile(filepath.Join(tampered, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	bad := "0000000000000000" + string(sums)[16:]
	if err := os.WriteFile(filepath.Join(tampered, "checksums.txt"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dist)))
	defer srv.Close()

	for _, c := range []struct{ name, helm, from string }{
		{"helm4 from a local folder", env.Helm4, dist},
		{"helm3 from an HTTP server", env.Helm3, srv.URL},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := pluginRelease(t, env)
			vars := append(helmHome(t.TempDir()), "HELM_AUTORECOVER_DIST="+c.from, "PATH=/usr/bin:/bin")
			if res := env.RunEnv(t, vars, c.helm, "plugin", "install", dir); res.ExitCode != 0 {
				t.Fatalf("plugin install: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			res := env.RunEnv(t, vars, c.helm, "autorecover", "version")
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "helm-autorecover") {
				t.Fatalf("helm autorecover version: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
	t.Run("a checksum that does not match", func(t *testing.T) {
		dir := pluginRelease(t, env)
		vars := append(helmHome(t.TempDir()), "HELM_AUTORECOVER_DIST="+tampered, "PATH=/usr/bin:/bin")
		res := env.RunEnv(t, vars, env.Helm4, "plugin", "install", dir)
		if res.ExitCode == 0 || !strings.Contains(res.Stdout+res.Stderr, "checksum mismatch") {
			t.Errorf("plugin install from a tampered archive: exit %d; want a refusal naming the checksum\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "bin", "helm-autorecover")); err == nil {
			t.Error("a binary was installed from the tampered archive")
		}
	})
}

// pluginRelease lays out the plugin's files as a release's source folder has
// them: no go.mod, no binary.
func pluginRelease(t *testing.T, env *testenv.Env) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "helm-autorecover")
	copyFile(t, filepath.Join(env.RepoRoot, "plugin.yaml"), filepath.Join(dir, "plugin.yaml"), 0o644)
	copyFile(t, filepath.Join(env.RepoRoot, "plugin.complete"), filepath.Join(dir, "plugin.complete"), 0o755)
	copyFile(t, filepath.Join(env.RepoRoot, "hack", "plugin-exec.sh"), filepath.Join(dir, "hack", "plugin-exec.sh"), 0o755)
	return dir
}

// pluginVersion is plugin.yaml's version.
func pluginVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("plugin.yaml has no version line:\n%s", data)
	}
	return string(m[1])
}
