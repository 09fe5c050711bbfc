package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
)

// The overhead scenario: the same install or upgrade by stock helm and by
// helm-autorecover, one after the other, alternating which goes first.

// overheadCase is one operation measured: chart, install or upgrade, with
// or without --wait.
type overheadCase struct {
	chart string // small or medium
	op    string // install or upgrade
	wait  bool
}

func (c overheadCase) String() string {
	s := c.op + " " + c.chart
	if c.wait {
		s += " --wait"
	}
	return s
}

// id is the case in a release name or a proxy phase.
func (c overheadCase) id() string {
	w := "n"
	if c.wait {
		w = "w"
	}
	return c.op[:1] + "-" + c.chart[:1] + w
}

// overheadCases are every case, the headline first (the goals are
// set on a no-wait upgrade of the small chart).
func overheadCases() []overheadCase {
	var out []overheadCase
	for _, op := range []string{"upgrade", "install"} {
		for _, chart := range []string{"small", "medium"} {
			for _, wait := range []bool{false, true} {
				out = append(out, overheadCase{chart, op, wait})
			}
		}
	}
	return out
}

// benchClient is a client measured: a binary and its flags.
type benchClient struct {
	name  string // as the tables say it
	id    string // in release names, proxy tags, CSV
	bin   string
	flags []string
}

func (s *suite) overheadClients() (stock, ours, oursRelease benchClient) {
	return benchClient{"stock helm", "stock", s.o.helm, nil},
		benchClient{"helm-autorecover", "ours", s.o.bin, nil},
		benchClient{"helm-autorecover, --lock-backend=release", "ours-release", s.o.bin, []string{"--lock-backend", "release"}}
}

// overheadRun is one timed run.
type overheadRun struct {
	c       overheadCase
	client  string // benchClient.id
	run     int
	seconds float64
	proxied bool // through the counting proxy (a counted run)
}

// overheadCount is the requests of one counted run, by verb and resource.
type overheadCount struct {
	c      overheadCase
	client string
	run    int
	counts map[countproxy.Key]int // Client and Phase empty
}

type overheadResult struct {
	cases   []overheadCase
	clients []benchClient
	runs    []overheadRun
	counts  []overheadCount
}

func (s *suite) overhead(ctx context.Context) (*overheadResult, error) {
	ns, err := s.namespace(ctx, "overhead")
	if err != nil {
		return nil, err
	}
	stock, ours, oursRelease := s.overheadClients()
	cases, err := pickCases(overheadCases(), s.o.cases)
	if err != nil {
		return nil, err
	}
	res := &overheadResult{cases: cases, clients: []benchClient{stock, ours, oursRelease}}
	var trace *os.File
	if s.o.trace != "" {
		if trace, err = os.Create(s.o.trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		defer func() { _ = trace.Close() }()
	}
	seq := 0
	for _, c := range res.cases {
		fmt.Fprintf(os.Stderr, "  %s: %d runs each, alternating\n", c, s.o.runs)
		chart, values := s.o.smallChart, []string(nil)
		if c.chart == "medium" {
			chart, values = s.o.mediumChart, []string{"--set", fmt.Sprintf("deployments=%d", s.o.mediumDeployments)}
		}
		// one runs the case once as client cl (direct when id is ""),
		// a fresh release for an install (uninstalled after), the
		// case's release otherwise.
		one := func(cl benchClient, id string) (*proc, error) {
			seq++
			rel := "u-" + c.id() + "-" + cl.id
			if c.op == "install" {
				rel = fmt.Sprintf("i-%s-%s-%d", c.id(), cl.id, seq)
			}
			args := append([]string{c.op, rel, chart, "-n", ns, "--set", fmt.Sprintf("message=m%d", seq)}, values...)
			if c.wait {
				args = append(args, "--wait", "--timeout", "5m")
			}
			p, err := s.mustRun(ctx, id, cl.bin, append(args, cl.flags...)...)
			if err != nil {
				return nil, err
			}
			if c.op == "install" {
				if _, err := s.mustRun(ctx, "", cl.bin, append([]string{"uninstall", rel, "-n", ns}, cl.flags...)...); err != nil {
					return nil, err
				}
			}
			return p, nil
		}
		if c.op == "upgrade" {
			for _, cl := range res.clients {
				rel := "u-" + c.id() + "-" + cl.id
				args := append([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "5m"}, values...)
				if _, err := s.mustRun(ctx, "", cl.bin, append(args, cl.flags...)...); err != nil {
					return nil, err
				}
			}
		}
		// Timed, directly against the API server: a warm-up each (helm's
		// and the Go runtime's files in the page cache, the lock backend
		// remembered), then alternating, each going first every other time.
		for _, cl := range []benchClient{stock, ours} {
			if _, err := one(cl, ""); err != nil {
				return nil, err
			}
		}
		for r := range s.o.runs {
			order := []benchClient{stock, ours}
			if r%2 == 1 {
				order = []benchClient{ours, stock}
			}
			for _, cl := range order {
				p, err := one(cl, "")
				if err != nil {
					return nil, err
				}
				res.runs = append(res.runs, overheadRun{c, cl.id, r, p.elapsed().Seconds(), false})
			}
		}
		// Counted, through the proxy, one client at a time.
		for _, cl := range res.clients {
			s.px.SetPhase("warm-up")
			if _, err := one(cl, cl.id); err != nil {
				return nil, err
			}
			for r := range s.o.countRuns {
				phase := fmt.Sprintf("%s|%s|%d", c.id(), cl.id, r)
				s.px.SetPhase(phase)
				p, err := one(cl, cl.id)
				if err != nil {
					return nil, err
				}
				s.px.SetPhase("between")
				counts := s.px.Count(func(rq countproxy.Request) bool { return rq.Phase == phase && rq.Client == cl.id },
					func(k countproxy.Key) countproxy.Key { k.Client, k.Phase = "", ""; return k })
				res.counts = append(res.counts, overheadCount{c, cl.id, r, counts})
				if trace != nil {
					writeTrace(trace, fmt.Sprintf("%s | %s | run %d", c, cl.name, r),
						s.px.Requests(func(rq countproxy.Request) bool { return rq.Phase == phase && rq.Client == cl.id }))
				}
				res.runs = append(res.runs, overheadRun{c, cl.id, r, p.elapsed().Seconds(), true})
			}
		}
	}
	return res, nil
}

// pickCases keeps the cases named (all when names is empty), in the order
// of all.
func pickCases(all []overheadCase, names []string) ([]overheadCase, error) {
	if len(names) == 0 {
		return all, nil
	}
	var out []overheadCase
	for _, c := range all {
		if slices.Contains(names, c.String()) {
			out = append(out, c)
		}
	}
	if len(out) != len(names) {
		known := make([]string, len(all))
		for i, c := range all {
			known[i] = c.String()
		}
		return nil, fmt.Errorf("--cases %q: unknown case (known: %s)", strings.Join(names, ","), strings.Join(known, ", "))
	}
	return out, nil
}

// writeTrace writes the requests of one counted run, one a line: the
// offset from the first, verb, resource (+meta for a metadata-only
// request), name, label selector, the rest of the query, the answer's
// code and how long it took.
func writeTrace(w io.Writer, title string, rqs []countproxy.Request) {
	fmt.Fprintf(w, "## %s: %d requests\n", title, len(rqs))
	for i, rq := range rqs {
		res := rq.Resource
		if rq.Meta {
			res += "+meta"
		}
		dur := "open"
		if !rq.End.IsZero() {
			dur = fmt.Sprintf("%.1fms", float64(rq.End.Sub(rq.Start).Microseconds())/1000)
		}
		fmt.Fprintf(w, "%3d %8.1fms %-7s %-32s %-40s sel=%q q=%q %d %s\n", i+1,
			float64(rq.Start.Sub(rqs[0].Start).Microseconds())/1000, rq.Verb, res, rq.Name, rq.Selector, rq.Query, rq.Code, dur)
	}
	fmt.Fprintln(w)
}

// seconds are the timed (direct) runs of a case by a client.
func (r *overheadResult) seconds(c overheadCase, client string) []float64 {
	var out []float64
	for _, x := range r.runs {
		if x.c == c && x.client == client && !x.proxied {
			out = append(out, x.seconds)
		}
	}
	return out
}

// requests is the median, over the counted runs, of the requests per key
// of a case by a client, and of their total.
func (r *overheadResult) requests(c overheadCase, client string) (perKey map[string]float64, total float64) {
	var totals []float64
	keys := map[string][]float64{}
	n := 0
	for _, x := range r.counts {
		if x.c != c || x.client != client {
			continue
		}
		n++
		t := 0
		for k, v := range x.counts {
			keys[keyName(k)] = append(keys[keyName(k)], float64(v))
			t += v
		}
		totals = append(totals, float64(t))
	}
	perKey = map[string]float64{}
	for k, vs := range keys {
		for len(vs) < n { // runs that made none of this kind
			vs = append(vs, 0)
		}
		perKey[k] = median(vs)
	}
	return perKey, median(totals)
}

func keyName(k countproxy.Key) string {
	s := k.Verb + " " + k.Resource
	if k.Meta {
		s += " (metadata)"
	}
	return s
}

func (s *suite) overheadReport(r *overheadResult) (section, error) {
	stock, ours, oursRelease := s.overheadClients()
	var rows [][]string
	for _, x := range r.runs {
		via := "direct"
		if x.proxied {
			via = "proxy"
		}
		rows = append(rows, []string{x.c.op, x.c.chart, strconv.FormatBool(x.c.wait), x.client, strconv.Itoa(x.run), via, sec3(x.seconds)})
	}
	if err := s.writeCSV("overhead.csv", []string{"op", "chart", "wait", "client", "run", "via", "seconds"}, rows); err != nil {
		return section{}, err
	}
	rows = nil
	for _, x := range r.counts {
		keys := make([]countproxy.Key, 0, len(x.counts))
		for k := range x.counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keyName(keys[i]) < keyName(keys[j]) })
		for _, k := range keys {
			rows = append(rows, []string{x.c.op, x.c.chart, strconv.FormatBool(x.c.wait), x.client, strconv.Itoa(x.run), k.Verb, k.Resource, strconv.FormatBool(k.Meta), strconv.Itoa(x.counts[k])})
		}
	}
	if err := s.writeCSV("overhead-requests.csv", []string{"op", "chart", "wait", "client", "run", "verb", "resource", "metadata_only", "requests"}, rows); err != nil {
		return section{}, err
	}
	if err := s.overheadPlots(r); err != nil {
		return section{}, err
	}

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("### Overhead on the happy path\n\n")
	p("Each case runs %d times with each binary, alternating (stock helm first in even rounds, helm-autorecover first in odd ones), after one untimed run of each; ", s.o.runs)
	p("wall time is the process's, start to exit, against the API server directly. ")
	p("The small chart is `internal/testenv/testdata/charts/app` (one ConfigMap, one Deployment); the medium one `hack/benchsuite/testdata/charts/medium` (%d Deployments, each with a Service and a ConfigMap). ", s.o.mediumDeployments)
	p("Every run sets a new value in the ConfigMaps; as in the e2e tests, an upgrade does not change the pods, so `--wait` (helm's watcher, `--timeout 5m`) waits for every resource to be seen ready, not for a rollout (ten Deployments rolled out at once on this cluster measure the controller-manager's ReplicaSet controller, which backs off on its own writes: 10 to 60 s a run). ")
	p("Installs are of a fresh release, uninstalled after (untimed).\n\n")
	var trows [][]string
	var summary []string
	for _, c := range r.cases {
		st, ou := median(r.seconds(c, stock.id)), median(r.seconds(c, ours.id))
		ratio := ou / st
		_, rs := r.requests(c, stock.id)
		_, ro := r.requests(c, ours.id)
		_, rr := r.requests(c, oursRelease.id)
		trows = append(trows, []string{
			"`" + c.String() + "`", secs(st), secs(ou), fmt.Sprintf("%.2f", ratio),
			fmt.Sprintf("%.0f", rs), fmt.Sprintf("%.0f (%+.0f)", ro, ro-rs), fmt.Sprintf("%.0f (%+.0f)", rr, rr-rs),
		})
		summary = append(summary, fmt.Sprintf("  %-24s stock %s, ours %s, ratio %.2f; requests %.0f / %.0f / %.0f", c, secs(st), secs(ou), ratio, rs, ro, rr))
	}
	p("%s\n", table([]string{"case", "stock helm, median", "helm-autorecover, median", "ratio", "requests, stock", "requests, helm-autorecover (auto: Lease)", "requests, `--lock-backend=release`"}, trows))
	head := r.cases[0]
	st, ou := median(r.seconds(head, stock.id)), median(r.seconds(head, ours.id))
	_, rs := r.requests(head, stock.id)
	_, ro := r.requests(head, ours.id)
	_, rr := r.requests(head, oursRelease.id)
	p("Goals of issue 13 on `%s` with default flags: median wall-time ratio at most 1.10: %.2f, %s; ", head, ou/st, verdict(ou/st <= 1.10))
	p("at most 5 more API requests than stock helm with the Lease backend: %+.0f, %s; at most 3 with the release backend: %+.0f, %s.\n\n",
		ro-rs, verdict(ro-rs <= 5), rr-rs, verdict(rr-rs <= 3))
	p("%s\n", s.image("Wall time of each case, stock helm and helm-autorecover", "overhead.png"))
	p("Requests per operation are the median of %s of each client through the counting proxy (after one uncounted run), by verb and resource. ", plural(s.o.countRuns, "run"))
	p("The `auto` backend resolves to the Lease for the admin the bench runs as. The no-wait cases in full (every case is in the CSV):\n\n")
	for _, c := range r.cases {
		if c.wait || c.chart != "small" {
			continue
		}
		p("`%s`:\n\n%s\n", c, requestTable(r, c, []benchClient{stock, ours, oursRelease}))
	}
	p("%s\n", s.image("API requests per operation, by client", "overhead-requests.png"))
	p("%s", s.footer("overhead", []string{fmt.Sprintf("--runs=%d", s.o.runs), fmt.Sprintf("--count-runs=%d", s.o.countRuns), fmt.Sprintf("--medium-deployments=%d", s.o.mediumDeployments)}, "overhead.csv", "overhead-requests.csv"))
	return section{markdown: b.String(), summary: strings.Join(summary, "\n")}, nil
}

// requestTable is the requests of one case by verb and resource, a column
// per client.
func requestTable(r *overheadResult, c overheadCase, clients []benchClient) string {
	per := make([]map[string]float64, len(clients))
	totals := make([]float64, len(clients))
	var names []string
	for i, cl := range clients {
		per[i], totals[i] = r.requests(c, cl.id)
		for k := range per[i] {
			if !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	sort.Strings(names)
	header := []string{"request"}
	for _, cl := range clients {
		header = append(header, cl.name)
	}
	var rows [][]string
	for _, k := range names {
		row := []string{k}
		for i := range clients {
			row = append(row, num(per[i][k]))
		}
		rows = append(rows, row)
	}
	row := []string{"**total**"}
	for i := range clients {
		row = append(row, "**"+num(totals[i])+"**")
	}
	return table(header, append(rows, row))
}

// num prints a count, with a decimal only when it has one.
func num(x float64) string {
	if x == float64(int64(x)) {
		return strconv.FormatInt(int64(x), 10)
	}
	return fmt.Sprintf("%.1f", x)
}

// plural is "1 run", "3 runs".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
