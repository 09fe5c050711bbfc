// Command benchcontroller measures the in-cluster controller at scale
// (issue 12, item 7). In the cluster KUBECONFIG names it creates 100
// namespaces and 10,000 helm releases of 4 revisions each (40,000 release
// Secrets as helm's secret driver writes them, created directly with
// client-go by parallel workers). 1% of the releases (one per namespace)
// are left stuck as our CLI leaves an upgrade it was SIGKILLed in: the
// newest revision pending-upgrade under a lock taken with the real lock
// code (gate, beat and, under the lease backend, the Lease) with leases
// spread over --lease-min..--lease-max, never renewed.
//
// It then starts `helm-autorecover controller` as a local process
// (--leader-elect=false, metrics and probes on free loopback ports,
// --log-level info), through a counting proxy by default, and reports:
// time to first sync (to /readyz, to controller-runtime's "Starting
// workers", to every pending release judged, to the first recovery); the
// controller's resident memory (VmRSS every second, peak VmHWM from
// /proc/PID/status); the delay from each lock's LOCKED TILL plus the
// takeover margin to its revision seen failed (a watch), to the
// controller's "recovered" log line, and the quantiles of its
// helm_autorecover_recovery_delay_seconds histogram; then, over --steady
// of steady state, the controller's requests (counted by the proxy, since
// the API server's apiserver_request_total cannot tell clients apart and
// its audit log records only writes), the API server's own request
// counters (all clients) and the audit log's writes by the controller's
// user agent. It ends with a table, writes its section of
// docs/benchmarks.md (between the benchcontroller markers; --doc names
// another document, --doc= none), and deletes its namespaces (--keep keeps
// them).
//
//	make bench-controller
//	go run ./hack/benchcontroller --bin bin/helm-autorecover [--steady 5m] [--keep] [--doc docs/benchmarks.md]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

type options struct {
	bin                                   string
	namespaces, releases, revisions       int
	pending, workers, lockWorkers         int
	ctrlWorkers                           int
	leaseMin, leaseMax                    time.Duration
	steady, recoverTimeout, cleanupWait   time.Duration
	keep, direct, ownNamespaces           bool
	lockBackend, auditLog, goMemLimit, md string
	doc                                   string
	ctrlEnv                               envList
}

// envList is a repeatable KEY=VALUE flag.
type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }

func (e *envList) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q: want KEY=VALUE", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/helm-autorecover", "helm-autorecover binary")
	flag.IntVar(&o.namespaces, "namespaces", 100, "namespaces")
	flag.IntVar(&o.releases, "releases", 10_000, "releases, spread evenly over the namespaces")
	flag.IntVar(&o.revisions, "revisions", 4, "revisions per release")
	flag.IntVar(&o.pending, "pending", 100, "releases left pending under a dead holder's lock")
	flag.IntVar(&o.workers, "workers", 16, "parallel writers of the set-up")
	flag.IntVar(&o.lockWorkers, "lock-workers", 8, "parallel dead holders taking their locks")
	flag.IntVar(&o.ctrlWorkers, "controller-workers", 4, "the controller's --workers")
	flag.DurationVar(&o.leaseMin, "lease-min", 15*time.Second, "shortest lease of a dead holder")
	flag.DurationVar(&o.leaseMax, "lease-max", 60*time.Second, "longest lease of a dead holder")
	flag.DurationVar(&o.steady, "steady", 5*time.Minute, "steady state measured after the recoveries")
	flag.DurationVar(&o.recoverTimeout, "recover-timeout", 15*time.Minute, "how long after the longest lease every recovery must be seen")
	flag.DurationVar(&o.cleanupWait, "cleanup-wait", 10*time.Minute, "how long to wait for the namespaces to be gone")
	flag.BoolVar(&o.keep, "keep", false, "keep the namespaces")
	flag.BoolVar(&o.ownNamespaces, "own-namespaces", false, "give the controller --namespaces with this run's namespaces only, so that it leaves others' pending releases alone (a trial on a cluster others use; its watches are then per namespace)")
	flag.BoolVar(&o.direct, "direct", false, "connect the controller to the API server directly, not through the counting proxy (then its reads cannot be counted)")
	flag.StringVar(&o.lockBackend, "lock-backend", protocol.BackendAuto, "the dead holders' --lock-backend (the CLI's default is auto)")
	flag.StringVar(&o.auditLog, "audit-log", "", "the API server's audit log (default: $LOCAL_CLUSTER_DIR or .local-cluster, logs/audit.log)")
	flag.StringVar(&o.goMemLimit, "gomemlimit", "90MiB", "GOMEMLIMIT of the controller, as the chart sets it (empty: unset)")
	flag.StringVar(&o.md, "markdown", "", "also write the Markdown section to this file")
	flag.StringVar(&o.doc, "doc", "docs/benchmarks.md", "write the figures into this document, between its benchcontroller markers (empty: do not)")
	flag.Var(&o.ctrlEnv, "controller-env", "KEY=VALUE added to the controller's environment (repeatable), e.g. HELM_QPS=50")
	flag.Parse()
	if o.auditLog == "" {
		dir := os.Getenv("LOCAL_CLUSTER_DIR")
		if dir == "" {
			dir = ".local-cluster"
		}
		o.auditLog = filepath.Join(dir, "logs", "audit.log")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcontroller:", err)
		os.Exit(1)
	}
}

// figures are what one run measured.
type figures struct {
	o       options
	machine machineInfo
	started time.Time

	records    int
	setupTook  time.Duration
	locksTook  time.Duration
	foreign    int
	pend       []*release
	firstDue   time.Duration // from the controller's start
	lastDue    time.Duration
	backendWas string

	toReady, toWorkers, toJudged, toFirstRecovery time.Duration
	workersSeen, judgedSeen, recoverySeen         bool

	watchDelays, logDelays []time.Duration
	early                  int // recovered before LOCKED TILL + margin
	missing                int

	hist            []bucket
	histCount       float64
	histSum         float64
	recoveries      float64
	ctrlErrors      float64
	warnLines       []string
	rss             []rssSample
	peakKiB         int64
	steadyRSS       []int64
	proxied         bool
	startupReqs     map[reqKey]int
	recoveryReqs    map[reqKey]int
	steadyReqs      map[reqKey]int
	fullReads       []request
	foreignFull     []request
	agents          []string
	apiDiff         map[reqKey]float64
	auditRecovery   map[reqKey]int
	auditSteady     map[reqKey]int
	auditRotated    bool
	auditErr        error
	steadyTook      time.Duration
	cleanupTook     time.Duration
	cleanupComplete bool
}

func run(ctx context.Context, o options) error {
	kubeconfig := os.Getenv("KUBECONFIG")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("KUBECONFIG=%q: %w", kubeconfig, err)
	}
	cfg.QPS = -1 // no client-side throttling of the set-up
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if o.releases%o.namespaces != 0 || o.pending > o.releases || o.leaseMin > o.leaseMax {
		return fmt.Errorf("--releases must be a multiple of --namespaces, --pending at most --releases, --lease-min at most --lease-max")
	}
	f := &figures{o: o, started: time.Now()}
	f.machine = machine(ctx, cs, o.bin)
	stamp := time.Now().Format("150405")
	rels := plan(stamp, o.namespaces, o.releases, o.pending)
	for _, r := range rels {
		if r.pending {
			f.pend = append(f.pend, r)
		}
	}
	for i, r := range f.pend {
		r.lease = o.leaseMin
		if n := len(f.pend); n > 1 {
			r.lease += time.Duration(int64(o.leaseMax-o.leaseMin) * int64(i) / int64(n-1))
		}
	}
	byKey := map[string]*release{}
	for _, r := range f.pend {
		byKey[r.ns+"/"+r.name] = r
	}

	// Pending releases of others in the cluster: the controller watches
	// every namespace and would recover those too.
	if l, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{
		LabelSelector: "owner=helm,status in (pending-install,pending-upgrade,pending-rollback)", ResourceVersion: "0",
	}); err == nil && !o.ownNamespaces {
		f.foreign = len(l.Items)
	}

	cleaned := false
	defer func() {
		if !o.keep && !cleaned {
			cleanup(cs, stamp, o.namespaces, o.cleanupWait, f)
		}
	}()
	fmt.Fprintf(os.Stderr, "creating %d namespaces and %d releases x %d revisions (%d Secrets), %d writers\n",
		o.namespaces, o.releases, o.revisions, o.releases*o.revisions, o.workers)
	t0 := time.Now()
	if err := createNamespaces(ctx, cs, stamp, o.namespaces, o.workers); err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	f.records, err = createRecords(ctx, cs, rels, o.revisions, o.workers)
	if err != nil {
		return fmt.Errorf("release records: %w", err)
	}
	f.setupTook = time.Since(t0)
	fmt.Fprintf(os.Stderr, "created %d Secrets in %s (%.0f/s)\n", f.records, f.setupTook.Round(time.Second), float64(f.records)/f.setupTook.Seconds())

	// The observer: revision N of a pending release seen failed.
	seen := watchFailed(cs, byKey, o.revisions)
	defer seen.stop()

	// The dead holders.
	conn, err := protocol.Connect(cfg, clock.RealClock{}, "secret")
	if err != nil {
		return err
	}
	t1 := time.Now()
	if err := takeLocks(ctx, conn, cs, o.lockBackend, f.pend, o.revisions, o.lockWorkers); err != nil {
		return err
	}
	f.locksTook = time.Since(t1)
	f.records += len(f.pend)
	if len(f.pend) > 0 {
		b, _, _ := conn.Stores(ctx, f.pend[0].ns, o.lockBackend)
		f.backendWas = b
	}
	fmt.Fprintf(os.Stderr, "%d dead holders left their locks in %s (backend %s)\n", len(f.pend), f.locksTook.Round(time.Millisecond), f.backendWas)

	// The controller, through the counting proxy.
	dir, err := os.MkdirTemp("", "benchcontroller-")
	if err != nil {
		return err
	}
	ctrlKubeconfig := kubeconfig
	var px *countproxy.Proxy
	if !o.direct {
		if px, err = countproxy.Start(cfg); err != nil {
			return err
		}
		defer px.Close()
		px.SetPhase("startup")
		ctrlKubeconfig = filepath.Join(dir, "controller.kubeconfig")
		if err = countproxy.WriteKubeconfig(ctrlKubeconfig, px.URL(), ""); err != nil {
			return err
		}
		f.proxied = true
	}
	var env []string
	if o.goMemLimit != "" {
		env = append(env, "GOMEMLIMIT="+o.goMemLimit)
	}
	env = append(append(env, "HELM_DRIVER=secret"), o.ctrlEnv...)
	logPath := filepath.Join(dir, "controller.log")
	auditStart := auditSize(o.auditLog)
	ctrlArgs := []string{"--workers", fmt.Sprint(o.ctrlWorkers)}
	if o.ownNamespaces {
		names := make([]string, o.namespaces)
		for i := range names {
			names[i] = nsName(stamp, i)
		}
		ctrlArgs = append(ctrlArgs, "--namespaces", strings.Join(names, ","))
	}
	c, err := startController(o.bin, ctrlKubeconfig, logPath, env, ctrlArgs)
	if err != nil {
		return err
	}
	defer c.stop()
	fmt.Fprintf(os.Stderr, "controller pid %d, log %s\n", c.cmd.Process.Pid, logPath)
	for _, r := range f.pend {
		d := r.due().Sub(c.start)
		if f.firstDue == 0 || d < f.firstDue {
			f.firstDue = d
		}
		f.lastDue = max(f.lastDue, d)
	}

	ready, err := c.waitReady(2 * time.Minute)
	if err != nil {
		return err
	}
	f.toReady = ready.Sub(c.start)
	// Every pending release judged once: counted by lock state, or
	// already recovered. The start-up phase ends then, or when the first
	// lock is due, whichever comes first; the count is watched on.
	judged := func() {
		if f.judgedSeen {
			return
		}
		if m, err := scrape(c.metrics); err == nil {
			n := m.sum("helm_autorecover_pending_releases", nil) + m.sum("helm_autorecover_recoveries_total", nil)
			if n >= float64(len(f.pend)+f.foreign) {
				f.toJudged, f.judgedSeen = time.Since(c.start), true
			}
		}
	}
	for judged(); !f.judgedSeen && time.Since(c.start) < f.firstDue && ctx.Err() == nil; judged() {
		time.Sleep(100 * time.Millisecond)
	}
	if l, ok := c.firstLog("Starting workers"); ok {
		f.toWorkers, f.workersSeen = l.At.Sub(c.start), true
	}
	fmt.Fprintf(os.Stderr, "ready after %s, workers started after %s, all pending judged: %s\n",
		f.toReady.Round(time.Millisecond), f.toWorkers.Round(time.Millisecond), orNA(f.judgedSeen, f.toJudged.Round(time.Millisecond).String()))
	if px != nil {
		px.SetPhase("recovery")
	}
	c.setPhase("recovery")

	// Every pending release recovered.
	deadline := c.start.Add(f.lastDue + o.recoverTimeout)
	lastNote := time.Now()
	fmt.Fprintf(os.Stderr, "waiting for %d recoveries (LOCKED TILL from %s to %s after the controller's start)\n",
		len(f.pend), f.firstDue.Round(time.Second), f.lastDue.Round(time.Second))
	for {
		for _, l := range c.logLines() {
			if l.Msg != "recovered" {
				continue
			}
			if r := byKey[l.Namespace+"/"+l.Release]; r != nil && r.logged.IsZero() {
				r.logged = l.At
			}
		}
		judged()
		left := 0
		for _, r := range f.pend {
			if seen.at(r).IsZero() || r.logged.IsZero() {
				left++
			}
		}
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		if time.Since(lastNote) > 30*time.Second {
			lastNote = time.Now()
			fmt.Fprintf(os.Stderr, "  %d of %d recovered\n", len(f.pend)-left, len(f.pend))
		}
		select {
		case <-c.exited:
			return fmt.Errorf("the controller exited: %w; log %s", c.waitErr, logPath)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// What follows a recovery (the Event, the lock's release) is part of it.
	time.Sleep(10 * time.Second)
	seen.stop()
	for _, r := range f.pend {
		r.seenFailed = seen.at(r)
		switch {
		case r.seenFailed.IsZero():
			f.missing++
			continue
		case r.seenFailed.Before(r.due()):
			f.early++
		}
		f.watchDelays = append(f.watchDelays, r.seenFailed.Sub(r.due()))
		if !r.logged.IsZero() {
			f.logDelays = append(f.logDelays, r.logged.Sub(r.due()))
		}
	}
	if l, ok := c.firstLog("recovered"); ok {
		f.toFirstRecovery, f.recoverySeen = l.At.Sub(c.start), true
	}
	fmt.Fprintf(os.Stderr, "%d of %d recovered\n", len(f.pend)-f.missing, len(f.pend))
	if err := writeCSV(filepath.Join(dir, "releases.csv"), f.pend); err != nil {
		return err
	}

	// Steady state.
	auditSteadyStart := auditSize(o.auditLog)
	before, err := apiMetrics(ctx, cs)
	if err != nil {
		return err
	}
	if px != nil {
		px.SetPhase("steady")
	}
	c.setPhase("steady")
	steadyStart := time.Now()
	fmt.Fprintf(os.Stderr, "steady state for %s\n", o.steady)
	for time.Since(steadyStart) < o.steady {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.exited:
			return fmt.Errorf("the controller exited: %w; log %s", c.waitErr, logPath)
		case <-time.After(min(time.Minute, o.steady-time.Since(steadyStart))):
		}
		if left := o.steady - time.Since(steadyStart); left > time.Second {
			fmt.Fprintf(os.Stderr, "  %s left\n", left.Round(time.Second))
		}
	}
	f.steadyTook = time.Since(steadyStart)
	after, err := apiMetrics(ctx, cs)
	if err != nil {
		return err
	}
	auditEnd := auditSize(o.auditLog)
	f.apiDiff = map[reqKey]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			f.apiDiff[k] = d
		}
	}

	// The controller's own account, then its memory.
	if m, err := scrape(c.metrics); err == nil {
		f.hist = m.buckets("helm_autorecover_recovery_delay_seconds")
		f.histCount = m.sum("helm_autorecover_recovery_delay_seconds_count", nil)
		f.histSum = m.sum("helm_autorecover_recovery_delay_seconds_sum", nil)
		f.recoveries = m.sum("helm_autorecover_recoveries_total", nil)
		f.ctrlErrors = m.sum("helm_autorecover_errors_total", nil)
	}
	if st, err := procStatus(c.cmd.Process.Pid); err == nil {
		f.peakKiB = st.hwm
	}
	f.rss = c.rssSamples()
	for _, s := range f.rss {
		f.peakKiB = max(f.peakKiB, s.Peak)
		if s.Phase == "steady" {
			f.steadyRSS = append(f.steadyRSS, s.RSS)
		}
	}
	for _, l := range c.logLines() {
		if lv := strings.ToUpper(l.Level); lv == "WARN" || lv == "ERROR" {
			f.warnLines = append(f.warnLines, l.Raw)
		}
	}
	c.stop()

	// Requests.
	agents := map[string]bool{}
	isController := func(ua string) bool { return agents[ua] }
	if px != nil {
		f.startupReqs, f.recoveryReqs, f.steadyReqs = phaseCounts(px, "startup"), phaseCounts(px, "recovery"), phaseCounts(px, "steady")
		f.agents = px.UserAgents()
		for _, a := range f.agents {
			agents[a] = true
		}
		f.fullReads = px.Requests(fullSecretRead)
		for _, rq := range f.fullReads {
			if byKey[rq.Namespace+"/"+releaseOfRead(rq)] == nil {
				f.foreignFull = append(f.foreignFull, rq)
			}
		}
	} else {
		// Without the proxy: the user agent client-go gives a binary of
		// this name (and its suffixes, as leader election's).
		prefix := filepath.Base(o.bin) + "/"
		f.agents = []string{prefix + "*"}
		isController = func(ua string) bool { return strings.HasPrefix(ua, prefix) }
	}
	match := func(counts map[reqKey]int, rotated bool, err error) map[reqKey]int {
		if err != nil {
			f.auditErr = err
		}
		f.auditRotated = f.auditRotated || rotated
		return counts
	}
	f.auditRecovery = match(readAudit(o.auditLog, auditStart, auditSteadyStart, isController))
	f.auditSteady = match(readAudit(o.auditLog, auditSteadyStart, auditEnd, isController))

	if !o.keep {
		cleanup(cs, stamp, o.namespaces, o.cleanupWait, f)
		cleaned = true
	}
	report(os.Stdout, f)
	if o.doc != "" {
		if err := writeDoc(o.doc, docSection(f)); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote the figures into %s\n", o.doc)
	}
	if o.md != "" {
		var b strings.Builder
		markdown(&b, f)
		if err := os.WriteFile(o.md, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "controller log: %s; per release: %s\n", logPath, filepath.Join(dir, "releases.csv"))
	return nil
}

// releaseOf names the release a read of a Secret was for: by its name
// (a record or a beat) or its label selector (name=...).
func releaseOfRead(rq request) string {
	switch {
	case strings.HasPrefix(rq.Name, "sh.helm.release.v1."):
		n := strings.TrimPrefix(rq.Name, "sh.helm.release.v1.")
		if i := strings.LastIndex(n, ".v"); i > 0 {
			return n[:i]
		}
		return n
	case strings.HasPrefix(rq.Name, "helm-autorecover.v1."):
		return strings.TrimPrefix(rq.Name, "helm-autorecover.v1.")
	case rq.Name != "":
		return rq.Name
	}
	for _, part := range strings.Split(rq.Selector, ",") {
		if v, ok := strings.CutPrefix(part, helmx.LabelName+"="); ok {
			return v
		}
	}
	return ""
}

// failedWatch records when revision N of each pending release is first
// seen failed, from an informer on helm's failed records.
type failedWatch struct {
	mu      sync.Mutex
	stopCh  chan struct{}
	stopped bool
	times   map[*release]time.Time
}

func watchFailed(cs kubernetes.Interface, byKey map[string]*release, rev int) *failedWatch {
	w := &failedWatch{stopCh: make(chan struct{}), times: map[*release]time.Time{}}
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "secrets", metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = "owner=helm,status=failed"
	})
	inf := cache.NewSharedInformer(lw, &corev1.Secret{}, 0)
	note := func(obj any) {
		now := time.Now()
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Name != helmx.ReleaseSecretName(s.Labels[helmx.LabelName], rev) {
			return
		}
		r := byKey[s.Namespace+"/"+s.Labels[helmx.LabelName]]
		if r == nil {
			return
		}
		w.mu.Lock()
		if _, ok := w.times[r]; !ok {
			w.times[r] = now
		}
		w.mu.Unlock()
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, n any) { note(n) },
	})
	go inf.Run(w.stopCh)
	cache.WaitForCacheSync(w.stopCh, inf.HasSynced)
	return w
}

func (w *failedWatch) at(r *release) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.times[r]
}

func (w *failedWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.stopCh)
	}
}

// apiMetrics reads the API server's request counters (admin credentials).
func apiMetrics(ctx context.Context, cs kubernetes.Interface) (map[reqKey]float64, error) {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics on the API server: %w", err)
	}
	m, err := parseProm(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	return requestTotals(m), nil
}

// cleanup deletes the run's namespaces and waits for them to be gone.
func cleanup(cs kubernetes.Interface, stamp string, n int, wait time.Duration, f *figures) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t := time.Now()
	fmt.Fprintf(os.Stderr, "deleting the %d namespaces\n", n)
	for i := range n {
		_ = cs.CoreV1().Namespaces().Delete(ctx, nsName(stamp, i), metav1.DeleteOptions{})
	}
	for ctx.Err() == nil {
		l, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: benchLabel + "=" + stamp})
		if err == nil && len(l.Items) == 0 {
			f.cleanupTook, f.cleanupComplete = time.Since(t), true
			fmt.Fprintf(os.Stderr, "namespaces gone after %s\n", f.cleanupTook.Round(time.Second))
			return
		}
		time.Sleep(2 * time.Second)
	}
	fmt.Fprintf(os.Stderr, "namespaces still terminating after %s (the namespace controller finishes)\n", wait)
}

func sortedKeys[V int | float64](m map[reqKey]V) []reqKey {
	keys := make([]reqKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		if keys[i].Resource != keys[j].Resource {
			return keys[i].Resource < keys[j].Resource
		}
		if keys[i].Verb != keys[j].Verb {
			return keys[i].Verb < keys[j].Verb
		}
		return !keys[i].Meta && keys[j].Meta
	})
	return keys
}
