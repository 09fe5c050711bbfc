package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestPluginHelm3AndHelm4 installs the repository as a helm plugin with the
// real upstream helm v3 and v4 binaries and runs a guarded upgrade through
// `helm autorecover`, with the namespace passed the way helm passes it to
// plugins (HELM_NAMESPACE from the global -n flag).
func TestPluginHelm3AndHelm4(t *testing.T) {
	env := testenv.Get(t)
	pluginDir := t.TempDir()
	copyFile(t, filepath.Join(env.RepoRoot, "plugin.yaml"), filepath.Join(pluginDir, "plugin.yaml"), 0o644)
	copyFile(t, filepath.Join(env.RepoRoot, "hack", "plugin-exec.sh"), filepath.Join(pluginDir, "hack", "plugin-exec.sh"), 0o755)
	copyFile(t, env.Bin(t), filepath.Join(pluginDir, "bin", "helm-autorecover"), 0o755)

	for name, helm := range map[string]string{"helm4": env.Helm4, "helm3": env.Helm3} {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("HELM_DATA_HOME", filepath.Join(home, "data"))
			t.Setenv("HELM_CONFIG_HOME", filepath.Join(home, "config"))
			t.Setenv("HELM_CACHE_HOME", filepath.Join(home, "cache"))
			res := runWithEnv(t, env, helm, "plugin", "install", pluginDir)
			if res.ExitCode != 0 {
				t.Fatalf("plugin install: %s%s", res.Stdout, res.Stderr)
			}
			ns := env.Namespace(t)
			const rel = "plugged"
			res = runWithEnv(t, env, helm, "-n", ns, "autorecover", "upgrade", "--install", rel, env.Chart("app"), "--wait", "--timeout", "60s")
			if res.ExitCode != 0 {
				t.Fatalf("helm autorecover upgrade --install: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			env.WaitForStatus(t, ns, rel, 1, "deployed", 5*time.Second)
			// The lease proves the operation went through the guard, in the
			// namespace helm passed on.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("lease of %s/%s after a plugin upgrade: %v", ns, rel, err)
			}
			if h := l.Spec.HolderIdentity; h != nil && *h != "" {
				t.Fatalf("lease still held by %q after the operation ended", *h)
			}
			res = runWithEnv(t, env, helm, "-n", ns, "autorecover", "list")
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, rel) {
				t.Fatalf("helm autorecover list in %s: exit %d, stdout %q", ns, res.ExitCode, res.Stdout)
			}
		})
	}
}

// runWithEnv runs like env.Run but with the test's HELM_* folders.
func runWithEnv(t *testing.T, env *testenv.Env, bin string, args ...string) testenv.Result {
	t.Helper()
	return env.RunEnv(t, []string{
		"HELM_DATA_HOME=" + os.Getenv("HELM_DATA_HOME"),
		"HELM_CONFIG_HOME=" + os.Getenv("HELM_CONFIG_HOME"),
		"HELM_CACHE_HOME=" + os.Getenv("HELM_CACHE_HOME"),
	}, bin, args...)
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatalf("reading %s: %v", from, err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatalf("mkdir for %s: %v", to, err)
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		t.Fatalf("writing %s: %v", to, err)
	}
}
