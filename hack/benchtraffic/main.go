// Command benchtraffic measures what one upgrade writes to etcd (issue 18,
// item 3): for a small release record and one near 1 MiB, it runs upgrades
// of the test chart with stock helm and with helm-autorecover under each
// lock backend, alone and with waiters queued behind a holder that works
// for a while, and prints per upgrade the writes and bytes to the release's
// records and to the lock's small objects (the beat and the Lease), from a
// watch of every version written in the namespace (JSON size, managed
// fields included: etcd's protobuf is a little smaller).
//
//	go run ./hack/benchtraffic --bin bin/helm-autorecover --helm ~/.cache/helm-autorecover/bin/helm-v4 [--baseline OLD-BINARY]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func main() {
	bin := flag.String("bin", "bin/helm-autorecover", "helm-autorecover binary")
	helm := flag.String("helm", os.ExpandEnv("$HOME/.cache/helm-autorecover/bin/helm-v4"), "stock helm binary")
	baseline := flag.String("baseline", "", "an earlier helm-autorecover binary to measure alongside (optional)")
	chart := flag.String("chart", "internal/testenv/testdata/charts/app", "the chart to upgrade")
	waiters := flag.Int("waiters", 5, "waiters queued behind the holder")
	hold := flag.Duration("hold", 15*time.Second, "how long the holder works (its --wait --timeout on pods that never schedule)")
	flag.Parse()
	if err := run(*bin, *baseline, *helm, *chart, *waiters, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "benchtraffic:", err)
		os.Exit(1)
	}
}

type client struct {
	name  string
	bin   string
	flags []string // the lock backend
	waits bool     // takes a lock (can queue with --lock-timeout)
}

type result struct {
	upgrades                 int
	recordWrites, lockWrites int
	recordBytes, lockBytes   int
	maxLock                  int
}

func run(bin, baseline, helm, chart string, waiters int, hold time.Duration) error {
	kubeconfig := os.Getenv("KUBECONFIG")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("KUBECONFIG=%q: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "benchtraffic")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	blob := filepath.Join(dir, "blob.txt")
	if err := os.WriteFile(blob, testenv.Incompressible(800_000), 0o600); err != nil {
		return err
	}
	clients := []client{
		{"stock helm", helm, nil, false},
		{"release backend", bin, []string{"--lock-backend", "release"}, true},
		{"lease backend", bin, []string{"--lock-backend", "lease"}, true},
	}
	if baseline != "" {
		clients = append(clients,
			client{"release (baseline)", baseline, []string{"--lock-backend", "release"}, true},
			client{"lease (baseline)", baseline, []string{"--lock-backend", "lease"}, true})
	}
	fmt.Printf("per upgrade: writes and KB to the release's records, to the lock's small objects (beat, Lease), largest lock write; %d waiters behind a holder working %s\n\n", waiters, hold)
	fmt.Printf("%-8s %-20s %-8s %8s %10s %8s %10s %12s %10s\n", "record", "client", "waiters", "rec/upg", "recKB/upg", "lock/upg", "lockKB/upg", "max lock B", "KB/upg")
	for _, size := range []struct {
		name string
		set  []string
	}{{"small", nil}, {"~800 KB", []string{"--set-file", "blob=" + blob}}} {
		for _, c := range clients {
			for _, w := range []int{0, waiters} {
				if w > 0 && !c.waits {
					continue
				}
				r, err := scenario(cs, c, chart, size.set, w, hold)
				if err != nil {
					return fmt.Errorf("%s, %s, %d waiters: %w", size.name, c.name, w, err)
				}
				u := float64(r.upgrades)
				fmt.Printf("%-8s %-20s %-8d %8.1f %10.0f %8.1f %10.1f %12d %10.0f\n", size.name, c.name, w,
					float64(r.recordWrites)/u, float64(r.recordBytes)/1000/u, float64(r.lockWrites)/u, float64(r.lockBytes)/1000/u,
					r.maxLock, float64(r.recordBytes+r.lockBytes)/1000/u)
			}
		}
	}
	return nil
}

// scenario installs the chart in a fresh namespace, then meters either
// three upgrades one after another (waiters 0) or one holder working for
// hold with waiters queued behind it.
func scenario(cs kubernetes.Interface, c client, chart string, set []string, waiters int, hold time.Duration) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("bench-traffic-%d", time.Now().UnixNano())
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return result{}, err
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) }()
	const rel = "bench"
	helm := func(command ...string) *exec.Cmd {
		argv := append(append(append(command, c.flags...), "-n", ns), set...)
		return exec.CommandContext(ctx, c.bin, argv...)
	}
	if out, err := helm("install", rel, chart).CombinedOutput(); err != nil {
		return result{}, fmt.Errorf("install: %w: %s", err, out)
	}
	meter, err := testenv.StartMeter(ctx, cs, ns)
	if err != nil {
		return result{}, err
	}
	defer meter.Stop()
	upgrades := 3
	if waiters == 0 {
		for i := range upgrades {
			if out, err := helm("upgrade", rel, chart, "--set", fmt.Sprintf("message=u%d", i)).CombinedOutput(); err != nil {
				return result{}, fmt.Errorf("upgrade: %w: %s", err, out)
			}
		}
	} else {
		upgrades = 1 + waiters
		holder := helm("upgrade", rel, chart, "--wait", "--timeout", hold.String(), "--lease-duration", "6s",
			"--set", "message=holder", "--set", "nodeSelector.never=matches")
		if err := holder.Start(); err != nil {
			return result{}, err
		}
		if err := pendingRevision(ctx, cs, ns, rel, 2); err != nil {
			_ = holder.Process.Kill()
			return result{}, err
		}
		ws := make([]*exec.Cmd, waiters)
		for i := range ws {
			ws[i] = helm("upgrade", rel, chart, "--lock-timeout", "5m", "--lease-duration", "6s", "--set", fmt.Sprintf("message=w%d", i))
			if err := ws[i].Start(); err != nil {
				return result{}, err
			}
		}
		_ = holder.Wait() // its --wait times out: the upgrade fails, as meant
		for i, w := range ws {
			if err := w.Wait(); err != nil {
				return result{}, fmt.Errorf("waiter %d: %w", i, err)
			}
		}
	}
	last := fmt.Sprintf("sh.helm.release.v1.%s.v%d", rel, 1+upgrades)
	if err := meter.WaitFor(ctx, "secrets", last, 2); err != nil {
		return result{}, err
	}
	var r result
	r.upgrades = upgrades
	for _, w := range meter.Writes() {
		switch {
		case strings.HasPrefix(w.Name, "sh.helm.release.v1."+rel+".v"):
			r.recordWrites++
			r.recordBytes += w.Bytes
		case strings.HasPrefix(w.Name, "helm-autorecover.v1."):
			r.lockWrites++
			r.lockBytes += w.Bytes
			r.maxLock = max(r.maxLock, w.Bytes)
		}
	}
	return r, nil
}

// pendingRevision waits until revision rev of rel exists (the holder has
// taken the lock and helm created it).
func pendingRevision(ctx context.Context, cs kubernetes.Interface, ns, rel string, rev int) error {
	name := fmt.Sprintf("sh.helm.release.v1.%s.v%d", rel, rev)
	for {
		if _, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
