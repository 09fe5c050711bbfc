// Package testenv gives integration tests the real local control plane
// (etcd, kube-apiserver, controller-manager, scheduler and a kwok node, see
// hack/local-cluster.sh), the upstream helm v4 and v3 binaries, and a freshly
// built helm-autorecover binary. It starts the cluster once when none is
// running and attaches to a running one otherwise; each test gets its own
// namespace. Under `go test -short` integration tests are skipped; CI never
// passes -short.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Env is the shared test environment of one test binary.
type Env struct {
	// Kubeconfig is the admin kubeconfig of the local cluster.
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	// Helm4 and Helm3 are upstream helm binaries (v4.3.x and v3.22.x).
	Helm4, Helm3 string
	// RepoRoot is the root of this repository.
	RepoRoot string
	// HelmHome isolates helm's config, cache and data folders from the user's.
	HelmHome string
}

var (
	once     sync.Once
	shared   *Env
	setupErr error
)

// Main runs the tests of a package and exits; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		_ = os.RemoveAll(shared.HelmHome)
	}
	for _, b := range []*builtBin{&plainBin, &chaosBin} {
		if b.path != "" {
			_ = os.RemoveAll(filepath.Dir(b.path))
		}
	}
	os.Exit(code)
}

// Get returns the shared environment, starting the local cluster if needed.
// It skips the test under -short and fails it when the cluster cannot start.
func Get(t testing.TB) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs the local control plane (run without -short)")
	}
	once.Do(func() { shared, setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("local control plane: %v", setupErr)
	}
	return shared
}

// RepoRoot returns the repository root, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CacheDir returns the folder that caches built binaries (see hack/lib.sh).
func CacheDir() string {
	if d := os.Getenv("HELM_AUTORECOVER_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "helm-autorecover")
}

func setup() (*Env, error) {
	root := RepoRoot()
	kubeconfig := os.Getenv("HELM_AUTORECOVER_TEST_KUBECONFIG")
	if kubeconfig == "" {
		cmd := exec.Command(filepath.Join(root, "hack", "local-cluster.sh"), "up")
		cmd.Stdout = os.Stderr
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("hack/local-cluster.sh up: %w", err)
		}
		dir := os.Getenv("LOCAL_CLUSTER_DIR")
		if dir == "" {
			dir = filepath.Join(root, ".local-cluster")
		}
		kubeconfig = filepath.Join(dir, "kubeconfig")
	}
	// The upstream helm binaries of the interop tests: the cluster's script
	// builds only the control plane.
	cmd := exec.Command(filepath.Join(root, "hack", "build-cluster-bins.sh"), "helm-v4", "helm-v3")
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/build-cluster-bins.sh helm-v4 helm-v3: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	home, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return nil, fmt.Errorf("helm home: %w", err)
	}
	bins := filepath.Join(CacheDir(), "bin")
	return &Env{
		Kubeconfig: kubeconfig,
		Config:     cfg,
		Client:     client,
		Helm4:      filepath.Join(bins, "helm-v4"),
		Helm3:      filepath.Join(bins, "helm-v3"),
		RepoRoot:   root,
		HelmHome:   home,
	}, nil
}

// Namespace creates a fresh namespace for t and deletes it when t ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	base := strings.ToLower(t.Name())
	base = strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, base)
	if len(base) > 40 {
		base = base[:40]
	}
	name := strings.Trim(base, "-") + "-" + rand.String(5)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("KEEP_FAILED_NAMESPACES") != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// Bin returns the path of a helm-autorecover binary built once per test
// binary from this checkout.
func (e *Env) Bin(t testing.TB) string {
	t.Helper()
	return plainBin.get(t, e.RepoRoot)
}

// ChaosBin returns helm-autorecover built once per test binary with the
// chaos tag: the fault suite's hooks (internal/chaos).
func (e *Env) ChaosBin(t testing.TB) string {
	t.Helper()
	return chaosBin.get(t, e.RepoRoot, "-tags", "chaos")
}

// builtBin is a helm-autorecover binary built once per test binary.
type builtBin struct {
	once sync.Once
	path string
	err  error
}

var plainBin, chaosBin builtBin

func (b *builtBin) get(t testing.TB, repo string, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "helm-autorecover-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "helm-autorecover")
		cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", b.path, "./cmd/helm-autorecover")...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("building helm-autorecover: %v", b.err)
	}
	return b.path
}

// Chart returns the path of a test chart under testdata/charts.
func (e *Env) Chart(name string) string {
	return filepath.Join(e.RepoRoot, "internal", "testenv", "testdata", "charts", name)
}

// HelmEnv is the environment for helm-like binaries run by tests: the local
// kubeconfig and isolated helm folders.
func (e *Env) HelmEnv() []string {
	env := os.Environ()
	return append(env,
		"KUBECONFIG="+e.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(e.HelmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(e.HelmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(e.HelmHome, "data"),
	)
}

// Result is the outcome of one command run by Run.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
	Elapsed        time.Duration
}

// Run runs bin with args to completion (at most 5 minutes) and returns its
// output and exit code.
func (e *Env) Run(t testing.TB, bin string, args ...string) Result {
	t.Helper()
	return e.RunEnv(t, nil, bin, args...)
}

// RunEnv is Run with extra environment variables (KEY=value) that override
// HelmEnv's.
func (e *Env) RunEnv(t testing.TB, extra []string, bin string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(e.HelmEnv(), extra...)
	var stdout, stderr strings.Builder
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	res := Result{Stdout: stdout.String(), Stderr: stderr.String(), Elapsed: time.Since(start)}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.ExitCode()
	default:
		t.Fatalf("running %s %v: %v", bin, args, err)
	}
	t.Logf("$ %s %s  (exit %d, %s)", filepath.Base(bin), strings.Join(args, " "), res.ExitCode, res.Elapsed.Round(time.Millisecond))
	return res
}

// Start starts bin with args in the background; the caller waits or kills it.
// Its output is collected in the returned Proc.
func (e *Env) Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	return e.StartEnv(t, nil, bin, args...)
}

// StartEnv is Start with extra environment variables (KEY=value) that
// override HelmEnv's.
func (e *Env) StartEnv(t testing.TB, extra []string, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(e.HelmEnv(), extra...)
	p := &Proc{Cmd: cmd}
	cmd.Stdout = &p.Stdout
	cmd.Stderr = &p.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s %v: %v", bin, args, err)
	}
	t.Logf("$ %s %s &  (pid %d)", filepath.Base(bin), strings.Join(args, " "), cmd.Process.Pid)
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}
