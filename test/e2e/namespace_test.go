package e2e

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestMissingNamespace: without --create-namespace, an install into a
// namespace that does not exist fails as stock helm's does (its message,
// its exit code), with nothing left behind; with --create-namespace the
// namespace is created before the lock, which lives in it.
func TestMissingNamespace(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	chart := env.Chart("app")
	ns := "missing-ns-" + rand.String(5)
	t.Cleanup(func() { _ = env.Client.CoreV1().Namespaces().Delete(t.Context(), ns, metav1.DeleteOptions{}) })

	stock := env.Run(t, env.Helm4, "install", "web", chart, "-n", ns)
	ours := env.Run(t, bin, "install", "web", chart, "-n", ns)
	if ours.ExitCode != stock.ExitCode || ours.ExitCode == 0 {
		t.Fatalf("exit code %d, stock helm's %d (want equal, not 0); stderr:\n%s", ours.ExitCode, stock.ExitCode, ours.Stderr)
	}
	if !strings.Contains(ours.Stderr, "not found") || !strings.Contains(ours.Stderr, ns) {
		t.Fatalf("stderr does not say the namespace is missing:\n%s", ours.Stderr)
	}
	if _, err := env.Client.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); err == nil {
		t.Fatalf("namespace %s exists after an install without --create-namespace", ns)
	}

	mustRun(t, env, bin, "install", "web", chart, "-n", ns, "--create-namespace")
	wantHistory(t, env, ns, "web", "1:deployed")
	if l, _ := lease(t, env, ns, "web"); holderOf(l) != "" {
		t.Fatalf("lock still held by %q after the install", holderOf(l))
	}
}
