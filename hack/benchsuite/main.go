// Command benchsuite measures stock helm and helm-autorecover side by side
// on the local control plane (issue 13 item 2) and writes the figures:
// a generated section of docs/benchmarks.md (tables, plots, the machine,
// the versions and the command that reruns each), PNG plots and the raw
// CSV under docs/bench/. Five scenarios, one file each:
//
//   - overhead: install and upgrade of a small and a medium chart, with
//     and without --wait, the two binaries alternating; wall time, and
//     API requests per operation by verb and resource through a counting
//     proxy (hack/internal/countproxy);
//   - recovery: SIGKILL during upgrade --wait, then the upgrade again at
//     once, per lease duration; stock helm's retry after the same kill
//     beside it;
//   - handoff: a holder hands the lock to a waiter queued with
//     --lock-timeout; the gap between the two;
//   - contention: many clients upgrading one release with --lock-timeout;
//   - preempt: a holder in upgrade --wait stopped by an upgrade --preempt
//     (issue 34); the time from the request to the preemptor's take.
//
// Every namespace it makes is named bench-suite-*, and deleted at the end.
//
//	KUBECONFIG=.local-cluster/kubeconfig go run ./hack/benchsuite [--scenarios overhead,recovery,handoff,contention,preempt] [--runs 20] ...
//	go run ./hack/benchsuite --replot    # the plots again from docs/bench/*.csv, no cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// scenarioNames are the bench's scenarios in the order they run and are
// written.
var scenarioNames = []string{"overhead", "recovery", "handoff", "contention", "preempt"}

// options are the command's flags.
type options struct {
	family                family // the bench (docs/benchmarks.md) or the fault suite (docs/reliability.md)
	bin, helm, kubeconfig string
	doc, data             string // the Markdown file and the folder of PNG and CSV
	scenarios             []string
	smallChart            string
	mediumChart           string
	mediumDeployments     int // the medium chart's Deployments (each with a Service and a ConfigMap)

	runs, countRuns   int             // overhead: timed runs per client and cell; counted runs
	cases             []string        // overhead: the cases to run (overheadCase.String); all when empty
	trace             string          // overhead: file that gets every counted request, one a line
	cycles            int             // recovery: kills per lease
	stockCycles       int             // recovery: stock helm's kills per lease
	leases            []time.Duration // recovery
	handoffs          int
	preempts          int // preempt: holders stopped at a preemptor's request
	clients, upgrades int // contention
	soloRuns          int // contention: upgrades alone, for the baseline

	chaos chaosOptions
}

func defaults() options {
	return options{
		family:            benchFamily,
		bin:               "bin/helm-autorecover",
		helm:              os.ExpandEnv("$HOME/.cache/helm-autorecover/bin/helm-v4"),
		kubeconfig:        os.Getenv("KUBECONFIG"),
		doc:               "docs/benchmarks.md",
		data:              "docs/bench",
		scenarios:         scenarioNames,
		smallChart:        "internal/testenv/testdata/charts/app",
		mediumChart:       "hack/benchsuite/testdata/charts/medium",
		mediumDeployments: 10,
		runs:              20,
		countRuns:         3,
		cycles:            20,
		stockCycles:       5,
		leases:            []time.Duration{3 * time.Second, 15 * time.Second},
		handoffs:          50,
		preempts:          20,
		clients:           20,
		upgrades:          5,
		soloRuns:          10,
		chaos:             chaosDefaults(),
	}
}

func main() {
	o := defaults()
	fs := flag.NewFlagSet("benchsuite", flag.ExitOnError)
	suiteName := fs.String("suite", "bench", "bench: stock helm and helm-autorecover side by side (docs/benchmarks.md); chaos: the fault-injection suite (docs/reliability.md, make chaos) against a binary built with -tags chaos")
	fs.StringVar(&o.bin, "bin", o.bin, "the helm-autorecover binary")
	fs.StringVar(&o.helm, "helm", o.helm, "the stock helm v4 binary")
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "admin kubeconfig of the cluster (default $KUBECONFIG)")
	fs.StringVar(&o.doc, "doc", o.doc, "the Markdown file whose generated section is written")
	fs.StringVar(&o.data, "data", o.data, "the folder for the PNG plots and the CSV")
	scen := fs.String("scenarios", strings.Join(o.scenarios, ","), "the scenarios to run, comma-separated: "+strings.Join(scenarioNames, ", "))
	fs.StringVar(&o.smallChart, "small-chart", o.smallChart, "overhead: the small chart (one ConfigMap, one Deployment)")
	fs.StringVar(&o.mediumChart, "medium-chart", o.mediumChart, "overhead and handoff: the medium chart (Deployments with Services and ConfigMaps)")
	fs.IntVar(&o.mediumDeployments, "medium-deployments", o.mediumDeployments, "overhead: Deployments of the medium chart, each with a Service and a ConfigMap")
	fs.IntVar(&o.runs, "runs", o.runs, "overhead: timed runs of each binary per case, alternating")
	fs.IntVar(&o.countRuns, "count-runs", o.countRuns, "overhead: runs of each client per case through the counting proxy")
	cases := fs.String("cases", "", "overhead: the cases to run, comma-separated as the table names them (\"upgrade small,install small --wait\"); all when empty")
	fs.StringVar(&o.trace, "trace", "", "overhead: write every request of the counted runs, one a line, in order, to this file (what each request of a case is)")
	fs.IntVar(&o.cycles, "cycles", o.cycles, "recovery: kill-and-retry cycles of helm-autorecover per lease")
	fs.IntVar(&o.stockCycles, "stock-cycles", o.stockCycles, "recovery: kill-and-retry cycles of stock helm per lease")
	leases := fs.String("leases", "3s,15s", "recovery: the --lease-duration values, comma-separated")
	fs.IntVar(&o.handoffs, "handoffs", o.handoffs, "handoff: handoffs from a holder to a waiter")
	fs.IntVar(&o.preempts, "preempts", o.preempts, "preempt: holders in upgrade --wait stopped by an upgrade --preempt")
	fs.IntVar(&o.clients, "clients", o.clients, "contention: clients upgrading one release at once")
	fs.IntVar(&o.upgrades, "upgrades", o.upgrades, "contention: upgrades per client, one after another")
	fs.IntVar(&o.soloRuns, "solo-runs", o.soloRuns, "contention: upgrades alone before, whose median is the baseline")
	replotOnly := fs.Bool("replot", false, "draw the plots of --scenarios again from the CSV in --data, without a cluster and without writing the document (the subtitles come from its captions)")
	o.chaos.flags(fs)
	_ = fs.Parse(os.Args[1:])
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch *suiteName {
	case "bench":
	case "chaos":
		o.family = chaosFamily
		for name, v := range map[string]*string{"bin": &o.bin, "doc": &o.doc, "data": &o.data, "scenarios": scen} {
			if !set[name] {
				*v = map[string]string{"bin": "bin/helm-autorecover-chaos", "doc": "docs/reliability.md", "data": "docs/reliability", "scenarios": strings.Join(chaosFamily.scenarios, ",")}[name]
			}
		}
	default:
		fmt.Fprintf(os.Stderr, "benchsuite: --suite=%q: must be bench or chaos\n", *suiteName)
		os.Exit(2)
	}
	o.scenarios = splitList(*scen)
	o.cases = splitList(*cases)
	var err error
	if o.leases, err = parseLeases(*leases); err != nil {
		fmt.Fprintln(os.Stderr, "benchsuite:", err)
		os.Exit(2)
	}

	if *replotOnly {
		if o.family.word != benchFamily.word {
			fmt.Fprintln(os.Stderr, "benchsuite: --replot: only the bench suite draws plots")
			os.Exit(2)
		}
		if err := replot(o); err != nil {
			fmt.Fprintln(os.Stderr, "benchsuite:", err)
			os.Exit(1)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	res, err := run(ctx, o)
	stop()
	violations := 0
	if o.family.word == chaosFamily.word && res != nil {
		var sum string
		sum, violations = chaosSummary(res)
		fmt.Print("\n" + sum)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchsuite:", err)
		os.Exit(1)
	}
	if violations > 0 {
		fmt.Fprintf(os.Stderr, "benchsuite: %d violations (the cases marked VIOLATION above, and %s)\n", violations, o.doc)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseLeases(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range splitList(s) {
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("--leases: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}
