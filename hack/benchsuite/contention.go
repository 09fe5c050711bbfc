package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The contention scenario: many clients upgrade one release at once, each
// several times in a row, all with --lock-timeout: every upgrade must
// succeed, one after another, the revisions contiguous, and the whole take
// little longer than the same number of upgrades run alone one after
// another.

// contentionUpgrade is one upgrade of one client.
type contentionUpgrade struct {
	client, n  int
	start, end time.Time
	exit       int
	stderr     string
	cpu        float64 // seconds of CPU (user and system) of the process
}

type contentionResult struct {
	solo       []float64 // seconds of each upgrade alone
	soloCPU    []float64 // seconds of CPU of each upgrade alone
	upgrades   []contentionUpgrade
	start, end time.Time
	// history checks
	revisions  int    // stored
	contiguous bool   // 1..revisions, each once
	statuses   string // counts by status
	badStatus  bool   // a revision neither superseded nor (the last) deployed
}

func (r *contentionResult) succeeded() int {
	n := 0
	for _, u := range r.upgrades {
		if u.exit == 0 {
			n++
		}
	}
	return n
}

func (r *contentionResult) total() float64 { return r.end.Sub(r.start).Seconds() }

// baseline is the wall time of as many upgrades run alone, one after
// another.
func (r *contentionResult) baseline() float64 {
	return median(r.solo) * float64(len(r.upgrades))
}

func (s *suite) contention(ctx context.Context) (*contentionResult, error) {
	ns, err := s.namespace(ctx, "contention")
	if err != nil {
		return nil, err
	}
	const rel = "contended"
	// --history-max 0: every revision is kept, so contiguity can be checked.
	flags := []string{"-n", ns, "--history-max", "0", "--lock-timeout", "15m"}
	upgrade := func(tag string) []string {
		return append([]string{"upgrade", rel, s.o.smallChart, "--set", "message=" + tag}, flags...)
	}
	if _, err := s.mustRun(ctx, "", s.o.bin, append([]string{"install", rel, s.o.smallChart}, flags[:2]...)...); err != nil {
		return nil, err
	}
	res := &contentionResult{}
	fmt.Fprintf(os.Stderr, "  %d upgrades alone, then %d clients x %d upgrades\n", s.o.soloRuns, s.o.clients, s.o.upgrades)
	// The baseline: one warm-up, then upgrades alone.
	for i := range s.o.soloRuns + 1 {
		p, err := s.mustRun(ctx, "", s.o.bin, upgrade(fmt.Sprintf("solo-%d", i))...)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			res.solo = append(res.solo, p.elapsed().Seconds())
			res.soloCPU = append(res.soloCPU, p.cpu().Seconds())
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	res.start = time.Now()
	for c := range s.o.clients {
		wg.Go(func() {
			for n := range s.o.upgrades {
				u := contentionUpgrade{client: c, n: n, exit: -1}
				p, err := s.run(ctx, "", s.o.bin, upgrade(fmt.Sprintf("c%d-u%d", c, n))...)
				if err == nil {
					u.start, u.end, u.exit, u.stderr, u.cpu = p.start, p.end, p.exit, tail(p.stderr.String(), 500), p.cpu().Seconds()
				} else {
					u.stderr = err.Error()
				}
				mu.Lock()
				res.upgrades = append(res.upgrades, u)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.end = time.Now()
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return res, err
	}
	res.revisions = len(h)
	res.contiguous = true
	counts := map[string]int{}
	for i, r := range h {
		if r.number != i+1 {
			res.contiguous = false
		}
		counts[r.status]++
		last := i == len(h)-1
		if (last && r.status != "deployed") || (!last && r.status != "superseded") {
			res.badStatus = true
		}
	}
	var parts []string
	for st, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, st))
	}
	slices.Sort(parts)
	res.statuses = strings.Join(parts, ", ")
	// The install, the warm-up and the upgrades alone, then the contended.
	want := 1 + 1 + s.o.soloRuns + s.o.clients*s.o.upgrades
	if ok := res.succeeded(); ok != len(res.upgrades) {
		for _, u := range res.upgrades {
			if u.exit != 0 {
				return res, fmt.Errorf("%d of %d upgrades failed; client %d upgrade %d: exit %d: %s", len(res.upgrades)-ok, len(res.upgrades), u.client, u.n, u.exit, u.stderr)
			}
		}
	}
	if !res.contiguous || res.revisions != want || res.badStatus {
		return res, fmt.Errorf("history of %s/%s: %d revisions (%s), contiguous %v; want %d, 1..%d, the last deployed and every other superseded",
			ns, rel, res.revisions, res.statuses, res.contiguous, want, want)
	}
	return res, nil
}

func (s *suite) contentionReport(r *contentionResult) (section, error) {
	var rows [][]string
	for i, x := range r.solo {
		rows = append(rows, []string{"alone", "", "", "", "", sec3(x), "0", sec3(r.soloCPU[i])})
	}
	var cpu []float64
	cpuSum := 0.0
	for _, u := range r.upgrades {
		rows = append(rows, []string{
			"contended", strconv.Itoa(u.client), strconv.Itoa(u.n), sec3(u.start.Sub(r.start).Seconds()), sec3(u.end.Sub(r.start).Seconds()),
			sec3(u.end.Sub(u.start).Seconds()), strconv.Itoa(u.exit), sec3(u.cpu),
		})
		cpu = append(cpu, u.cpu)
		cpuSum += u.cpu
	}
	if err := s.writeCSV("contention.csv", []string{"kind", "client", "upgrade", "start_s", "end_s", "seconds", "exit", "cpu_s"}, rows); err != nil {
		return section{}, err
	}
	if err := s.contentionPlot(r); err != nil {
		return section{}, err
	}
	ratio := r.total() / r.baseline()
	n := len(r.upgrades)
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("### Contention\n\n")
	p("%d clients start at once, each running %d no-wait upgrades of one release (the small chart) one after another, with `--lock-timeout 15m` and `--history-max 0` (every revision kept), default flags otherwise. ", s.o.clients, s.o.upgrades)
	p("Before them, %d upgrades run alone (after one warm-up); %d times their median is the baseline.\n\n", len(r.solo), n)
	p("%s\n", table([]string{"upgrades", "succeeded", "total", fmt.Sprintf("baseline: %d x one upgrade alone", n), "ratio", "goal", "history"}, [][]string{{
		strconv.Itoa(n), strconv.Itoa(r.succeeded()), secs(r.total()),
		fmt.Sprintf("%d x %s = %s", n, secs(median(r.solo)), secs(r.baseline())),
		fmt.Sprintf("%.2f", ratio), fmt.Sprintf("at most 1.1: %s", verdict(ratio <= 1.1)),
		fmt.Sprintf("%d revisions, contiguous: %v; %s", r.revisions, r.contiguous, r.statuses),
	}}))
	p("Where the time goes: the clients' own CPU (user and system time of each helm-autorecover process, most of it helm's: rendering, and parsing the API server's OpenAPI schema to validate the manifest) against the machine's %d cores. Contended, the next holder's work runs beside the other clients' start-up and waiting and the API server's, not alone.\n\n", runtime.NumCPU())
	p("%s\n", table([]string{"client CPU per upgrade, alone (median)", "contended (median, waiting included)", "clients' CPU over the contended run", "its share of the machine"}, [][]string{{
		secs(median(r.soloCPU)), secs(median(cpu)), secs(cpuSum), fmt.Sprintf("%.0f%% of %d cores x %s", 100*cpuSum/(float64(runtime.NumCPU())*r.total()), runtime.NumCPU(), secs(r.total())),
	}}))
	p("%s\n", s.image("Upgrades completed over time, contended and one after another", "contention.png"))
	p("%s", s.footer("contention", []string{fmt.Sprintf("--clients=%d", s.o.clients), fmt.Sprintf("--upgrades=%d", s.o.upgrades), fmt.Sprintf("--solo-runs=%d", s.o.soloRuns)}, "contention.csv"))
	return section{markdown: b.String(), summary: fmt.Sprintf("  %d of %d succeeded in %s; baseline %s; ratio %.2f; %d revisions, contiguous %v",
		r.succeeded(), n, secs(r.total()), secs(r.baseline()), ratio, r.revisions, r.contiguous)}, nil
}

// contentionPlot: upgrades completed over time, and the baseline's pace.
func (s *suite) contentionPlot(r *contentionResult) error {
	p := s.newPlot("Contention: upgrades completed over time", "seconds since the clients started", "upgrades completed")
	var ends []float64
	for _, u := range r.upgrades {
		if u.exit == 0 {
			ends = append(ends, u.end.Sub(r.start).Seconds())
		}
	}
	slices.Sort(ends)
	xys := plotter.XYs{{X: 0, Y: 0}}
	for i, e := range ends {
		xys = append(xys, plotter.XY{X: e, Y: float64(i)}, plotter.XY{X: e, Y: float64(i + 1)})
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color, l.Width = colOurs, vg.Points(1.5)
	p.Add(l)
	p.Legend.Add("contended", l)
	base, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: r.baseline(), Y: float64(len(r.upgrades))}})
	if err != nil {
		return err
	}
	base.Color, base.Width, base.Dashes = colStock, vg.Points(1.2), []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(base)
	p.Legend.Add("alone, one after another at the median pace", base)
	goal, err := points(plotter.XYs{{X: 1.1 * r.baseline(), Y: float64(len(r.upgrades))}}, colGoal, draw.CrossGlyph{})
	if err != nil {
		return err
	}
	p.Add(goal)
	p.Legend.Add("goal: all done by 1.1 x the baseline", goal)
	p.X.Min, p.Y.Min = 0, 0
	p.X.Max *= 1.05
	return s.savePlot(p, "contention.png", 18*vg.Centimeter, 12*vg.Centimeter)
}
