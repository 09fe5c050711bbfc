package main

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// machineInfo says where the figures come from.
type machineInfo struct {
	cores     int
	cpu       string
	memMiB    int64
	kernel    string
	kube      string
	binary    string // the controller's version line
	goVersion string // the binary's Go
	deps      string // helm, client-go, controller-runtime of the binary
}

func machine(ctx context.Context, cs kubernetes.Interface, bin string) machineInfo {
	m := machineInfo{cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kib, _ := strconv.ParseInt(f[1], 10, 64)
				m.memMiB = kib / 1024
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		m.kube = v.GitVersion
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, bin, "version").Output(); err == nil {
		m.binary = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	if bi, err := buildinfo.ReadFile(bin); err == nil {
		m.goVersion = bi.GoVersion
		var deps []string
		for _, d := range bi.Deps {
			switch d.Path {
			case "helm.sh/helm/v4", "k8s.io/client-go", "sigs.k8s.io/controller-runtime":
				v := d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
				deps = append(deps, d.Path+" "+v)
			}
		}
		m.deps = strings.Join(deps, ", ")
	}
	return m
}

// percentile is the nearest-rank percentile of ds (sorted in place).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t / time.Duration(len(ds))
}

// writeCSV writes one line per pending release: its lease, LOCKED TILL,
// when it was due, seen failed and logged recovered.
func writeCSV(path string, pend []*release) error {
	var b strings.Builder
	b.WriteString("namespace,release,lease_s,locked_till,due,seen_failed,logged,seen_delay_s,logged_delay_s\n")
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	dl := func(t, from time.Time) string {
		if t.IsZero() {
			return ""
		}
		return fmt.Sprintf("%.3f", t.Sub(from).Seconds())
	}
	for _, r := range pend {
		fmt.Fprintf(&b, "%s,%s,%.1f,%s,%s,%s,%s,%s,%s\n", r.ns, r.name, r.lease.Seconds(), ts(r.lockedTill), ts(r.due()),
			ts(r.seenFailed), ts(r.logged), dl(r.seenFailed, r.due()), dl(r.logged, r.due()))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// rssStats are the largest, mean and last VmRSS of a phase.
func rssStats(samples []rssSample, phase string) (maxKiB, meanKiB, lastKiB int64, n int) {
	var sum int64
	for _, s := range samples {
		if s.Phase != phase {
			continue
		}
		maxKiB = max(maxKiB, s.RSS)
		sum += s.RSS
		lastKiB = s.RSS
		n++
	}
	if n > 0 {
		meanKiB = sum / int64(n)
	}
	return
}

func heapLast(samples []rssSample, phase string) (heap, goroutines float64) {
	for _, s := range samples {
		if s.Phase == phase && s.Heap > 0 {
			heap, goroutines = s.Heap, s.Goro
		}
	}
	return
}

// lastSplit is the last sample's anonymous and file-backed RSS.
func lastSplit(samples []rssSample) (anon, file int64) {
	if n := len(samples); n > 0 {
		return samples[n-1].Anon, samples[n-1].File
	}
	return 0, 0
}

// readKinds sorts full Secret reads: GETs of helm's records, of beats, of
// others, and LISTs.
func readKinds(rs []request) (records, beats, other, lists int) {
	for _, rq := range rs {
		switch {
		case rq.Verb != "get":
			lists++
		case strings.HasPrefix(rq.Name, "sh.helm.release.v1."):
			records++
		case strings.HasPrefix(rq.Name, "helm-autorecover.v1."):
			beats++
		default:
			other++
		}
	}
	return
}

func keyName(k reqKey) string {
	s := k.Verb + " " + k.Resource
	if k.Meta {
		s += " (metadata)"
	}
	return s
}

func total[V int | float64](m map[reqKey]V) V {
	var t V
	for _, v := range m {
		t += v
	}
	return t
}

// goal is one goal of the issue and whether this run met it.
type goal struct {
	name, got string
	ok        bool
	known     bool
}

func goals(f *figures) []goal {
	steadyMax, _, _, _ := rssStats(f.rss, "steady")
	p99 := percentile(slices.Clone(f.watchDelays), 0.99)
	lists, watches := 0, 0
	for k, n := range f.steadyReqs {
		switch k.Verb {
		case "list":
			lists += n
		case "watch":
			watches += n
		}
	}
	return []goal{
		{"peak RSS (VmHWM) at most 100 MiB", mib(f.peakKiB), f.peakKiB <= 100*1024, f.peakKiB > 0},
		{"steady RSS at most 100 MiB", mib(steadyMax), steadyMax <= 100*1024, steadyMax > 0},
		{"p99 expiry-to-recovery at most 2 s (seen failed)", secs(p99), p99 <= 2*time.Second && f.missing == 0, len(f.watchDelays) > 0},
		{"no periodic LIST (steady state)", fmt.Sprintf("%d LIST, %d WATCH in %s", lists, watches, f.steadyTook.Round(time.Second)), lists == 0, f.proxied},
		{"no full-Secret read but of recovered releases", fmt.Sprintf("%d of other releases (%d in all)", len(f.foreignFull), len(f.fullReads)), len(f.foreignFull) == 0, f.proxied},
	}
}

func report(w io.Writer, f *figures) {
	o := f.o
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("\nController at scale (issue 12, item 7), %s\n", f.started.Format("2006-01-02 15:04 MST"))
	p("machine: %d cores (%s), %d MiB memory, Linux %s; Kubernetes %s\n", f.machine.cores, f.machine.cpu, f.machine.memMiB, f.machine.kernel, f.machine.kube)
	p("controller: %s; %s; %s\n", f.machine.binary, f.machine.goVersion, f.machine.deps)
	p("set-up: %d namespaces, %d releases x %d revisions = %d helm release Secrets in %s (%.0f/s, %d writers)\n",
		o.namespaces, o.releases, o.revisions, f.records, f.setupTook.Round(time.Second), float64(f.records-len(f.pend))/f.setupTook.Seconds(), o.workers)
	p("dead holders: %d pending releases (%s backend, leases %s..%s), locked in %s; %d pending releases of others in the cluster\n",
		len(f.pend), f.backendWas, o.leaseMin, o.leaseMax, f.locksTook.Round(time.Millisecond), f.foreign)
	how := "through a counting proxy"
	if !f.proxied {
		how = "directly"
	}
	p("controller run %s, --workers %d, GOMEMLIMIT=%q %s, --leader-elect=false --log-level info\n\n", how, o.ctrlWorkers, o.goMemLimit, o.ctrlEnv.String())

	p("first sync (from process start)\n")
	p("  %-44s %s\n", "/readyz 200", secs(f.toReady))
	p("  %-44s %s\n", `"Starting workers" (cache synced)`, orNA(f.workersSeen, secs(f.toWorkers)))
	p("  %-44s %s\n", "every pending release judged (metrics)", orNA(f.judgedSeen, secs(f.toJudged)))
	p("  %-44s %s (first LOCKED TILL + margin at %s)\n\n", "first recovery (log)", orNA(f.recoverySeen, secs(f.toFirstRecovery)), secs(f.firstDue))

	p("expiry-to-recovery, from LOCKED TILL + %s, %d releases (%d not seen recovered, %d seen before it)\n", "250ms", len(f.pend), f.missing, f.early)
	p("  %-30s %8s %8s %8s %8s %8s\n", "", "min", "p50", "p99", "max", "mean")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"seen failed (watch)", f.watchDelays}, {`"recovered" logged`, f.logDelays}} {
		ds := slices.Clone(row.ds)
		if len(ds) == 0 {
			p("  %-30s (none)\n", row.name)
			continue
		}
		p("  %-30s %8.3f %8.3f %8.3f %8.3f %8.3f\n", row.name, percentile(ds, 0).Seconds(), percentile(ds, 0.5).Seconds(), percentile(ds, 0.99).Seconds(), slices.Max(ds).Seconds(), mean(ds).Seconds())
	}
	p50, b50, ok50 := quantile(0.5, f.hist)
	p99, b99, ok99 := quantile(0.99, f.hist)
	if ok50 && ok99 {
		p("  helm_autorecover_recovery_delay_seconds (LOCKED TILL to recovery, no margin): %.0f observations, mean %.3f s, p50 %.3f s (bucket le %g), p99 %.3f s (bucket le %g)\n",
			f.histCount, f.histSum/math.Max(f.histCount, 1), p50, b50, p99, b99)
	}
	p("  controller counted %.0f recoveries, %.0f errors; %d warning or error log lines\n\n", f.recoveries, f.ctrlErrors, len(f.warnLines))
	for i, l := range f.warnLines {
		if i == 5 {
			p("  ...\n")
			break
		}
		p("  %s\n", l)
	}

	p("memory (VmRSS every second from /proc/PID/status)\n")
	p("  %-12s %12s %12s %12s %8s\n", "phase", "max", "mean", "last", "samples")
	for _, ph := range []string{"startup", "recovery", "steady"} {
		mx, mean, last, n := rssStats(f.rss, ph)
		p("  %-12s %12s %12s %12s %8d\n", ph, mib(mx), mib(mean), mib(last), n)
	}
	heap, goro := heapLast(f.rss, "steady")
	anon, file := lastSplit(f.rss)
	p("  peak (VmHWM) %s; at the end: %s anonymous + %s file-backed (the binary's pages), Go heap in use %.1f MiB, %.0f goroutines\n\n",
		mib(f.peakKiB), mib(anon), mib(file), heap/(1<<20), goro)

	if f.proxied {
		p("the controller's requests (counted by the proxy; user agents %s)\n", strings.Join(f.agents, ", "))
		for _, ph := range []struct {
			name string
			m    map[reqKey]int
			per  int
		}{{"startup (start to every pending release judged)", f.startupReqs, 0}, {"recovery (to 10 s after the last recovery)", f.recoveryReqs, len(f.pend)}, {fmt.Sprintf("steady state (%s)", f.steadyTook.Round(time.Second)), f.steadyReqs, 0}} {
			p("  %s: %d requests\n", ph.name, total(ph.m))
			for _, k := range sortedKeys(ph.m) {
				if ph.per > 0 {
					p("    %-60s %6d  %6.2f per recovery\n", keyName(k), ph.m[k], float64(ph.m[k])/float64(ph.per))
				} else {
					p("    %-60s %6d\n", keyName(k), ph.m[k])
				}
			}
		}
		recs, beats, other, lists := readKinds(f.fullReads)
		p("  full Secret reads, all phases: %d GET of helm's records, %d GET of beats, %d other GET, %d LIST (by release); of releases not recovered: %d\n",
			recs, beats, other, lists, len(f.foreignFull))
		for i, rq := range f.foreignFull {
			if i == 10 {
				p("    ...\n")
				break
			}
			p("    %s %s/%s %s (%s)\n", rq.Verb, rq.Namespace, rq.Name, rq.Selector, rq.Phase)
		}
		p("\n")
	} else {
		p("the controller's reads cannot be counted: run directly (--direct); the API server's counters below are every client's\n\n")
	}

	p("the API server's apiserver_request_total over the steady state, every client (it has no client label): %.0f requests\n", total(f.apiDiff))
	for _, k := range sortedKeys(f.apiDiff) {
		p("    %-60s %6.0f\n", keyName(k), f.apiDiff[k])
	}
	p("\nthe audit log's writes by the controller's user agents (the local cluster audits writes to Secrets, ConfigMaps and Leases only)")
	if f.auditErr != nil {
		p(": %v", f.auditErr)
	}
	if f.auditRotated {
		p(" (rotated meanwhile: incomplete)")
	}
	p("\n  start to steady state: %d\n", total(f.auditRecovery))
	for _, k := range sortedKeys(f.auditRecovery) {
		p("    %-60s %6d  %6.2f per recovery\n", keyName(k), f.auditRecovery[k], float64(f.auditRecovery[k])/float64(max(len(f.pend), 1)))
	}
	p("  steady state: %d\n", total(f.auditSteady))
	for _, k := range sortedKeys(f.auditSteady) {
		p("    %-60s %6d\n", keyName(k), f.auditSteady[k])
	}
	if f.cleanupComplete {
		p("\nclean-up: the namespaces were gone %s after their deletion\n", f.cleanupTook.Round(time.Second))
	}

	p("\ngoals\n")
	for _, g := range goals(f) {
		verdict := "met"
		switch {
		case !g.known:
			verdict = "not measured"
		case !g.ok:
			verdict = "MISSED"
		}
		p("  %-50s %-40s %s\n", g.name, g.got, verdict)
	}
	p("\n--- Markdown for docs/benchmarks.md ---\n\n")
	markdown(w, f)
}

func orNA(ok bool, s string) string {
	if !ok {
		return "not seen"
	}
	return s
}

// markdown writes the figures as a section of docs/benchmarks.md.
func markdown(w io.Writer, f *figures) {
	o := f.o
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("Measured %s with `make bench-controller` (%d cores, %s, %d MiB; Linux %s; Kubernetes %s; %s, %s, %s):\n\n",
		f.started.Format("2006-01-02"), f.machine.cores, f.machine.cpu, f.machine.memMiB, f.machine.kernel, f.machine.kube, f.machine.binary, f.machine.goVersion, f.machine.deps)
	p("| figure | value |\n| --- | --- |\n")
	p("| set-up | %d Secrets in %s (%.0f/s, %d writers) |\n", f.records, f.setupTook.Round(time.Second), float64(f.records-len(f.pend))/f.setupTook.Seconds(), o.workers)
	p("| dead holders | %d (%s backend, leases %s to %s) |\n", len(f.pend), f.backendWas, o.leaseMin, o.leaseMax)
	p("| controller | %s |\n", strings.TrimSpace(fmt.Sprintf("--workers %d, GOMEMLIMIT=%s %s", o.ctrlWorkers, o.goMemLimit, o.ctrlEnv.String())))
	p("| start to `/readyz` 200 | %s |\n", secs(f.toReady))
	p("| start to \"Starting workers\" (cache synced) | %s |\n", orNA(f.workersSeen, secs(f.toWorkers)))
	p("| start to every pending release judged | %s |\n", orNA(f.judgedSeen, secs(f.toJudged)))
	p("| start to first recovery (first lock due at %s) | %s |\n", secs(f.firstDue), orNA(f.recoverySeen, secs(f.toFirstRecovery)))
	ds := slices.Clone(f.watchDelays)
	ls := slices.Clone(f.logDelays)
	if len(ds) > 0 {
		p("| LOCKED TILL + 250 ms to revision seen failed: p50 / p99 / max | %.3f / %.3f / %.3f s |\n", percentile(ds, 0.5).Seconds(), percentile(ds, 0.99).Seconds(), slices.Max(ds).Seconds())
	}
	if len(ls) > 0 {
		p("| LOCKED TILL + 250 ms to \"recovered\" logged: p50 / p99 / max | %.3f / %.3f / %.3f s |\n", percentile(ls, 0.5).Seconds(), percentile(ls, 0.99).Seconds(), slices.Max(ls).Seconds())
	}
	if p50, b50, ok := quantile(0.5, f.hist); ok {
		p99, b99, _ := quantile(0.99, f.hist)
		p("| `helm_autorecover_recovery_delay_seconds` p50 / p99 (bucket) | %.3f (le %g) / %.3f (le %g) s |\n", p50, b50, p99, b99)
	}
	p("| recovered / not seen recovered | %d / %d |\n", len(f.pend)-f.missing, f.missing)
	for _, ph := range []string{"startup", "recovery", "steady"} {
		mx, mean, _, _ := rssStats(f.rss, ph)
		p("| RSS, %s: max / mean | %s / %s |\n", ph, mib(mx), mib(mean))
	}
	p("| peak RSS (VmHWM) | %s |\n", mib(f.peakKiB))
	if anon, file := lastSplit(f.rss); anon > 0 {
		p("| RSS at the end: anonymous / file-backed | %s / %s |\n", mib(anon), mib(file))
	}
	if f.proxied {
		p("| requests: startup / recovery (per recovery) / steady %s | %d / %d (%.1f) / %d |\n", f.steadyTook.Round(time.Second),
			total(f.startupReqs), total(f.recoveryReqs), float64(total(f.recoveryReqs))/float64(max(len(f.pend), 1)), total(f.steadyReqs))
		recs, beats, other, lists := readKinds(f.fullReads)
		p("| full Secret reads: GET record / GET beat / other GET / LIST by release | %d / %d / %d / %d |\n", recs, beats, other, lists)
		p("| full Secret reads of releases not recovered | %d |\n", len(f.foreignFull))
	}
	p("| audited writes by the controller: recovery / steady | %d / %d |\n", total(f.auditRecovery), total(f.auditSteady))
	if f.cleanupComplete {
		p("| namespaces gone after deletion | %s |\n", f.cleanupTook.Round(time.Second))
	}
	if f.proxied {
		p("\nThe controller's requests, by phase (counted by the proxy):\n\n| request | startup | recovery | per recovery | steady |\n| --- | --- | --- | --- | --- |\n")
		all := map[reqKey]int{}
		for _, m := range []map[reqKey]int{f.startupReqs, f.recoveryReqs, f.steadyReqs} {
			for k, n := range m {
				all[k] += n
			}
		}
		for _, k := range sortedKeys(all) {
			p("| %s | %d | %d | %.2f | %d |\n", keyName(k), f.startupReqs[k], f.recoveryReqs[k], float64(f.recoveryReqs[k])/float64(max(len(f.pend), 1)), f.steadyReqs[k])
		}
	}
	p("\nThe API server's `apiserver_request_total` over the steady state, every client (watches summed):\n\n| request | count |\n| --- | --- |\n")
	watches, kinds := 0.0, 0
	for _, k := range sortedKeys(f.apiDiff) {
		if k.Verb == "watch" {
			watches += f.apiDiff[k]
			kinds++
			continue
		}
		p("| %s | %.0f |\n", keyName(k), f.apiDiff[k])
	}
	if kinds > 0 {
		p("| watch (%d resources) | %.0f |\n", kinds, watches)
	}
	p("\nGoals:\n\n| goal | measured | |\n| --- | --- | --- |\n")
	for _, g := range goals(f) {
		verdict := "met"
		switch {
		case !g.known:
			verdict = "not measured"
		case !g.ok:
			verdict = "**missed**"
		}
		p("| %s | %s | %s |\n", g.name, g.got, verdict)
	}
}
