package main

import (
	"context"
	"encoding/json"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const release = "web"

// TestIntegrationEmbed builds the example program and runs it against the
// local cluster: it installs, upgrades (stock helm reads the result), and
// exits 3 without writing while another client holds the release's lock.
func TestIntegrationEmbed(t *testing.T) {
	env := testenv.Get(t)
	bin := filepath.Join(t.TempDir(), "embed")
	build := exec.Command("go", "build", "-o", bin, "./examples/embed")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/embed: %v\n%s", err, out)
	}
	ns := env.Namespace(t)
	ctx := context.Background()
	args := func(extra ...string) []string {
		return append([]string{"--release", release, "--namespace", ns, "--chart", env.Chart("app"), "--kubeconfig", env.Kubeconfig}, extra...)
	}
	summary := func() string { return strings.Join(env.Summary(t, ns, release), " ") }
	// versions maps each revision record, and the lock's Lease, to its
	// resourceVersion: any write to them changes it.
	versions := func() map[string]string {
		out := map[string]string{}
		for _, r := range env.History(t, ns, release) {
			out[r.Secret.Name] = r.Secret.ResourceVersion
		}
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName(release), metav1.GetOptions{})
		switch {
		case err == nil:
			out["lease"] = l.ResourceVersion
		case !apierrors.IsNotFound(err):
			t.Fatal(err)
		}
		return out
	}

	r := env.Run(t, bin, args()...)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "installed") {
		t.Fatalf("first run: exit %d, stdout %q, stderr %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if got := summary(); got != "1:deployed" {
		t.Fatalf("history after the install = %s", got)
	}

	r = env.Run(t, bin, args("--set", "message=second")...)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "upgraded") {
		t.Fatalf("second run: exit %d, stdout %q, stderr %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if got := summary(); got != "1:superseded 2:deployed" {
		t.Fatalf("history after the upgrade = %s", got)
	}
	hr := env.Run(t, env.Helm4, "history", release, "-n", ns, "-o", "json")
	var h []map[string]any
	if hr.ExitCode != 0 || json.Unmarshal([]byte(hr.Stdout), &h) != nil {
		t.Fatalf("stock helm history: exit %d, %s %s", hr.ExitCode, hr.Stdout, hr.Stderr)
	}
	if len(h) != 2 || h[0]["status"] != "superseded" || h[1]["status"] != "deployed" || h[1]["description"] != "Upgrade complete" {
		t.Fatalf("stock helm history = %v", h)
	}
	if vr := env.Run(t, env.Helm4, "get", "values", release, "-n", ns, "-o", "json"); vr.ExitCode != 0 || !strings.Contains(vr.Stdout, `"message":"second"`) {
		t.Fatalf("stock helm get values: exit %d, %s %s", vr.ExitCode, vr.Stdout, vr.Stderr)
	}

	// Another client holds a live lock: the program exits 3 and writes
	// nothing.
	holder, err := autorecover.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lk, err := holder.Acquire(ctx, autorecover.LockRequest{Release: release, Namespace: ns, Operation: autorecover.OpUpgrade, Who: "holder@embed-test"})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			_ = lk.Release(context.Background())
		}
	})
	before := versions()
	r = env.Run(t, bin, args("--set", "message=third")...)
	if r.ExitCode != 3 || !strings.Contains(r.Stderr, lk.Session()) {
		t.Fatalf("run under a live lock: exit %d (want 3), stderr %s (want the holder's session %s)", r.ExitCode, r.Stderr, lk.Session())
	}
	t.Logf("refused: %s", strings.TrimSpace(r.Stderr))
	if after := versions(); !maps.Equal(before, after) {
		t.Fatalf("the refused run wrote the release's history or lock: %v -> %v", before, after)
	}
	if got := summary(); got != "1:superseded 2:deployed" {
		t.Fatalf("history after the refused run = %s", got)
	}

	// Once the holder releases, the program runs again.
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released = true
	if r = env.Run(t, bin, args("--set", "message=third")...); r.ExitCode != 0 {
		t.Fatalf("run after the holder released: exit %d, stderr %s", r.ExitCode, r.Stderr)
	}
	if got := summary(); got != "1:superseded 2:superseded 3:deployed" {
		t.Fatalf("history after the last run = %s", got)
	}
}
