package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
)

// suite is what the scenarios share: the cluster, the counting proxy, the
// environment of the helm processes and the namespaces to delete.
type suite struct {
	o       options
	cs      kubernetes.Interface
	px      *countproxy.Proxy
	dir     string   // helm's folders, the proxy's kubeconfigs
	env     []string // of every helm process
	machine machineInfo
	// plotNote is the plots' subtitle: when, where, with what, in short.
	plotNote string

	mu          sync.Mutex
	kubeconfigs map[string]string
	namespaces  []string
}

// results are the figures of the scenarios that ran.
type results struct {
	machine    machineInfo
	overhead   *overheadResult
	recovery   *recoveryResult
	handoff    *handoffResult
	contention *contentionResult
	preempt    *preemptResult
	chaos      map[string]*chaosResult
	failed     map[string]error // chaos groups that could not run to their end
}

// run runs the scenarios o asks for and writes their figures.
func run(ctx context.Context, o options) (*results, error) {
	for _, name := range o.scenarios {
		if !slices.Contains(o.family.scenarios, name) {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(o.family.scenarios, ", "))
		}
	}
	for _, p := range []*string{&o.bin, &o.helm, &o.smallChart, &o.mediumChart} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	if o.family.word == chaosFamily.word && o.chaos.auditLog == "" {
		o.chaos.auditLog = defaultAuditLog(o.kubeconfig)
	}
	s := &suite{o: o}
	var err error
	if err = s.connect(); err != nil {
		return nil, err
	}
	defer func() { s.px.Close() }()
	if s.dir, err = os.MkdirTemp("", "benchsuite-"); err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(s.dir) }()
	defer s.deleteNamespaces()
	// Helm's folders and helm-autorecover's memory of the lock backend
	// ($XDG_CACHE_HOME) are the bench's own, warmed by untimed runs.
	s.env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(s.dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(s.dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(s.dir, "helm", "data"),
		"XDG_CACHE_HOME="+filepath.Join(s.dir, "xdg-cache"),
	)
	s.machine = readMachine(ctx, s.cs, o)
	s.plotNote = "measured " + time.Now().UTC().Format("2006-01-02") + "; " + s.machine.short()
	res := &results{machine: s.machine, chaos: map[string]*chaosResult{}, failed: map[string]error{}}
	fmt.Fprintf(os.Stderr, "benchsuite: %s\n", s.machine.summary())
	for _, name := range o.scenarios {
		start := time.Now()
		fmt.Fprintf(os.Stderr, "benchsuite: %s...\n", name)
		var sec section
		switch name {
		case "overhead":
			sec, err = measure(ctx, &res.overhead, s.overhead, s.overheadReport)
		case "recovery":
			sec, err = measure(ctx, &res.recovery, s.recovery, s.recoveryReport)
		case "handoff":
			sec, err = measure(ctx, &res.handoff, s.handoff, s.handoffReport)
		case "contention":
			sec, err = measure(ctx, &res.contention, s.contention, s.contentionReport)
		case "preempt":
			sec, err = measure(ctx, &res.preempt, s.preempt, s.preemptReport)
		default:
			sec, err = s.chaosScenario(ctx, name, res)
			if err != nil && ctx.Err() == nil {
				// One group that cannot run to its end does not stop
				// the others: its failure is written and kept for the
				// exit status, and the cluster is brought back first.
				fmt.Fprintf(os.Stderr, "benchsuite: %s FAILED: %v\n", name, err)
				res.failed[name] = err
				if err := s.writeSection(name, s.chaosFailedSection(name, err, res.chaos[name])); err != nil {
					return res, err
				}
				if err := s.recoverCluster(ctx); err != nil {
					return res, fmt.Errorf("%s failed (%w), and the cluster could not be brought back for the groups after it: %w", name, res.failed[name], err)
				}
				continue
			}
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		if err := s.writeSection(name, sec); err != nil {
			return res, err
		}
		fmt.Fprintf(os.Stderr, "benchsuite: %s done in %s\n%s\n", name, time.Since(start).Round(time.Second), sec.summary)
	}
	if len(res.failed) > 0 {
		var names []string
		for _, n := range o.scenarios {
			if res.failed[n] != nil {
				names = append(names, n)
			}
		}
		return res, fmt.Errorf("%d of %d groups did not run to their end (%s); their errors are above and in %s", len(names), len(o.scenarios), strings.Join(names, ", "), o.doc)
	}
	return res, nil
}

// connect (again) makes the suite's client and counting proxy from the
// admin kubeconfig, and forgets the kubeconfigs made from it.
func (s *suite) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %q (set --kubeconfig or KUBECONFIG): %w", s.o.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = -1, 0 // the bench's own reads are not throttled
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	px, err := countproxy.Start(rest.CopyConfig(cfg))
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.px != nil {
		s.px.Close()
	}
	s.cs, s.px, s.kubeconfigs = cs, px, map[string]string{}
	return nil
}

// measure runs a scenario, keeps its result (what it measured before it
// failed too) and reports it.
func measure[R any](ctx context.Context, dst **R, scenario func(context.Context) (*R, error), report func(*R) (section, error)) (section, error) {
	r, err := scenario(ctx)
	*dst = r
	if err != nil {
		return section{}, err
	}
	return report(r)
}

// kubeconfig returns the kubeconfig of a client: the admin's for "" (the
// API server directly), else one for the counting proxy that tags the
// client's requests with id (the same file, so the same server URL, every
// time: helm-autorecover remembers its lock backend per server).
func (s *suite) kubeconfig(id string) (string, error) {
	if id == "" {
		return s.o.kubeconfig, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.kubeconfigs[id]; ok {
		return p, nil
	}
	p := filepath.Join(s.dir, "kubeconfig-"+id)
	if err := countproxy.WriteKubeconfig(p, s.px.ClientURL(id), ""); err != nil {
		return "", err
	}
	s.kubeconfigs[id] = p
	return p, nil
}

// namespace creates a namespace for a scenario, deleted when the suite ends.
func (s *suite) namespace(ctx context.Context, scenario string) (string, error) {
	name := "bench-suite-" + scenario + "-" + rand.String(5)
	if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating namespace %s: %w", name, err)
	}
	s.mu.Lock()
	s.namespaces = append(s.namespaces, name)
	s.mu.Unlock()
	return name, nil
}

func (s *suite) deleteNamespaces() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range s.namespaces {
		if err := s.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			fmt.Fprintf(os.Stderr, "benchsuite: deleting namespace %s: %v\n", ns, err)
		}
	}
}

// proc is one helm or helm-autorecover process.
type proc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	start, end     time.Time
	exit           int // -1 when it did not start or was killed
	done           chan struct{}
}

// start starts bin with args, as the client id (see kubeconfig).
func (s *suite) start(ctx context.Context, id, bin string, args ...string) (*proc, error) {
	kc, err := s.kubeconfig(id)
	if err != nil {
		return nil, err
	}
	return s.startWith(ctx, kc, nil, bin, args...)
}

// startWith starts bin with args, with kubeconfig kc and extra environment.
func (s *suite) startWith(ctx context.Context, kc string, env []string, bin string, args ...string) (*proc, error) {
	p := &proc{args: args, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Env = append(append(slices.Clip(s.env), "KUBECONFIG="+kc), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.end = time.Now()
		p.exit = 0
		if err != nil {
			p.exit = -1
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				p.exit = ee.ExitCode()
			}
		}
		close(p.done)
	}()
	return p, nil
}

// run runs bin with args to its end.
func (s *suite) run(ctx context.Context, id, bin string, args ...string) (*proc, error) {
	p, err := s.start(ctx, id, bin, args...)
	if err != nil {
		return nil, err
	}
	<-p.done
	return p, nil
}

// mustRun runs bin with args and fails unless it exits 0.
func (s *suite) mustRun(ctx context.Context, id, bin string, args ...string) (*proc, error) {
	p, err := s.run(ctx, id, bin, args...)
	if err != nil {
		return nil, err
	}
	return p, p.err()
}

func (p *proc) wait() *proc {
	<-p.done
	return p
}

func (p *proc) elapsed() time.Duration { return p.end.Sub(p.start) }

// cpu is the user and system time of the finished process (zero when it
// did not run).
func (p *proc) cpu() time.Duration {
	if p.cmd.ProcessState == nil {
		return 0
	}
	return p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
}

// err says how the process failed, with the end of its output.
func (p *proc) err() error {
	if p.exit == 0 {
		return nil
	}
	return fmt.Errorf("%s: exit %d: %s", strings.Join(p.args, " "), p.exit, tail(p.stderr.String(), 800))
}

func (p *proc) kill() { _ = p.cmd.Process.Signal(syscall.SIGKILL) }

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// syncBuffer is a bytes.Buffer a process writes while the bench reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// revision is one stored revision of a release, from its record's labels.
type revision struct {
	number int
	status string
}

// history reads the stored revisions of rel, oldest first.
func (s *suite) history(ctx context.Context, ns, rel string) ([]revision, error) {
	list, err := s.cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + rel})
	if err != nil {
		return nil, fmt.Errorf("reading the history of %s/%s: %w", ns, rel, err)
	}
	var out []revision
	for _, sec := range list.Items {
		n, err := strconv.Atoi(sec.Labels["version"])
		if err != nil {
			return nil, fmt.Errorf("record %s/%s: version label %q", ns, sec.Name, sec.Labels["version"])
		}
		out = append(out, revision{n, sec.Labels["status"]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].number < out[j].number })
	return out, nil
}

// waitFor polls cond every interval until it holds, fails, or timeout.
func waitFor(ctx context.Context, what string, timeout, interval time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting %s for %s: %w", timeout, what, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// waitStatus waits until revision rev of rel has status.
func (s *suite) waitStatus(ctx context.Context, ns, rel string, rev int, status string, timeout time.Duration) error {
	return waitFor(ctx, fmt.Sprintf("revision %d of %s/%s to be %s", rev, ns, rel, status), timeout, 50*time.Millisecond, func() (bool, error) {
		h, err := s.history(ctx, ns, rel)
		if err != nil {
			return false, err
		}
		for _, r := range h {
			if r.number == rev && r.status == status {
				return true, nil
			}
		}
		return false, nil
	})
}
