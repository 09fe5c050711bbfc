// Command benchlocks measures how reading locks scales with the size of
// helm's release records (issue 18, item 4): it stores RELEASES releases of
// REVISIONS revisions each, every record about SIZE bytes, in one namespace
// of the cluster KUBECONFIG names, then runs, RUNS times each and
// alternating, `helm-autorecover locks -n NS --all` (and on an empty
// namespace), `helm list -n NS` and `helm-autorecover list --locks -n NS`,
// and prints each command's median wall time and peak memory (max RSS).
//
//	go run ./hack/benchlocks --bin bin/helm-autorecover --helm ~/.cache/helm-autorecover/bin/helm-v4 [--baseline OLD-BINARY]
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	bin := flag.String("bin", "bin/helm-autorecover", "helm-autorecover binary")
	helm := flag.String("helm", os.ExpandEnv("$HOME/.cache/helm-autorecover/bin/helm-v4"), "stock helm binary")
	baseline := flag.String("baseline", "", "an earlier helm-autorecover binary to measure alongside (optional)")
	releases := flag.Int("releases", 300, "releases in the namespace")
	revisions := flag.Int("revisions", 3, "stored revisions per release")
	size := flag.Int("size", 111_000, "approximate bytes per stored record")
	runs := flag.Int("runs", 5, "runs of each command")
	flag.Parse()
	if err := run(*bin, *baseline, *helm, *releases, *revisions, *size, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "benchlocks:", err)
		os.Exit(1)
	}
}

func run(bin, baseline, helm string, releases, revisions, size, runs int) error {
	kubeconfig := os.Getenv("KUBECONFIG")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("KUBECONFIG=%q: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	stamp := time.Now().Format("150405")
	ns, empty := "bench-locks-"+stamp, "bench-locks-empty-"+stamp
	for _, n := range []string{ns, empty} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		defer func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), n, metav1.DeleteOptions{}) }()
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	// Random text compresses little: the stored (gzipped, base64) record
	// ends up about size bytes.
	filler := make([]byte, size*3/4)
	if _, err := rand.Read(filler); err != nil {
		return err
	}
	manifest := "# " + base64.StdEncoding.EncodeToString(filler) + "\n"
	start := time.Now()
	for i := range releases {
		name := fmt.Sprintf("app-%03d", i)
		for rev := 1; rev <= revisions; rev++ {
			st := common.StatusSuperseded
			if rev == revisions {
				st = common.StatusDeployed
			}
			r := &rspb.Release{
				Name: name, Namespace: ns, Version: rev, Manifest: manifest,
				Info:  &rspb.Info{Status: st, Description: "benchmark"},
				Chart: &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: "app", Version: "0.1.0"}},
			}
			if err := d.Create(fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, rev), r); err != nil {
				return err
			}
		}
	}
	sample, err := cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.app-000.v1", metav1.GetOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("stored %d releases x %d revisions in %s, %d bytes per record (%s)\n\n",
		releases, revisions, ns, len(sample.Data["release"]), time.Since(start).Round(time.Second))

	cmds := []struct {
		name string
		argv []string
	}{
		{"locks, empty namespace", []string{bin, "locks", "-n", empty, "--all"}},
		{"locks --all", []string{bin, "locks", "-n", ns, "--all"}},
		{"helm list", []string{helm, "list", "-n", ns}},
		{"list --locks", []string{bin, "list", "--locks", "-n", ns}},
	}
	if baseline != "" {
		cmds = append(cmds,
			struct {
				name string
				argv []string
			}{"locks --all (baseline)", []string{baseline, "locks", "-n", ns, "--all"}},
			struct {
				name string
				argv []string
			}{"list --locks (baseline)", []string{baseline, "list", "--locks", "-n", ns}})
	}
	walls := make([][]time.Duration, len(cmds))
	rss := make([][]int64, len(cmds))
	for range runs {
		for i, c := range cmds {
			w, m, err := measure(c.argv)
			if err != nil {
				return fmt.Errorf("%s: %w", strings.Join(c.argv, " "), err)
			}
			walls[i] = append(walls[i], w)
			rss[i] = append(rss[i], m)
		}
	}
	fmt.Printf("%-24s %12s %14s   (median of %d)\n", "command", "wall", "peak memory", runs)
	for i, c := range cmds {
		fmt.Printf("%-24s %12s %10.0f MiB\n", c.name, median(walls[i]).Round(time.Millisecond), float64(median(rss[i]))/1024)
	}
	return nil
}

// measure runs argv and returns its wall time and peak RSS in KiB.
func measure(argv []string) (time.Duration, int64, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("%w: %s", err, out.String())
	}
	wall := time.Since(start)
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return wall, 0, nil
	}
	return wall, ru.Maxrss, nil
}

func median[T int64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
