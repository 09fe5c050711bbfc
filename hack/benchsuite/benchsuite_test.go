package main

import (
	"context"
	"encoding/csv"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSuiteTiny runs every scenario once at a tiny size against the local
// control plane, so that `make test` keeps the benchmark from rotting. It
// asserts outcomes only (every operation succeeded, the revisions are
// contiguous, stock helm was refused, the files are written and their
// numbers parse), never a time: the figures are make bench's.
func TestSuiteTiny(t *testing.T) {
	env := testenv.Get(t)
	dir := t.TempDir()
	o := defaults()
	o.bin, o.helm, o.kubeconfig = env.Bin(t), env.Helm4, env.Kubeconfig
	o.doc, o.data = filepath.Join(dir, "benchmarks.md"), filepath.Join(dir, "bench")
	o.smallChart = env.Chart("app")
	o.mediumChart = filepath.Join(env.RepoRoot, "hack", "benchsuite", "testdata", "charts", "medium")
	o.mediumDeployments = 2
	o.runs, o.countRuns = 2, 1
	o.cycles, o.stockCycles, o.leases = 2, 1, []time.Duration{3 * time.Second}
	o.handoffs = 2
	o.clients, o.upgrades, o.soloRuns = 3, 2, 2
	o.preempts = 2
	const before = "# Benchmarks\n\nA section written by hand.\n"
	if err := os.WriteFile(o.doc, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	res, err := run(ctx, o)
	if err != nil {
		t.Fatalf("benchsuite: %v", err)
	}

	// Overhead: every case, both binaries, every run (a failed run fails
	// the scenario); every counted run made requests.
	cases := overheadCases()
	if got, want := len(res.overhead.runs), len(cases)*(2*o.runs+3*o.countRuns); got != want {
		t.Errorf("overhead: %d runs recorded; want %d", got, want)
	}
	for _, c := range res.overhead.counts {
		if len(c.counts) == 0 {
			t.Errorf("overhead: %s by %s: no request counted", c.c, c.client)
		}
	}
	// Recovery: every retry of helm-autorecover succeeded, every retry of
	// stock helm was refused.
	ours, stock := 0, 0
	for _, c := range res.recovery.cycles {
		switch c.client {
		case "ours":
			ours++
			if c.exit != 0 {
				t.Errorf("recovery: cycle %d: the retry exited %d", c.cycle, c.exit)
			}
		case "stock":
			stock++
			if len(c.attempts) == 0 || slices.Contains(c.refused, false) {
				t.Errorf("recovery: stock helm's cycle %d: retries refused %v; want every one (at least one)", c.cycle, c.refused)
			}
			if !strings.Contains(c.after, "pending-upgrade") {
				t.Errorf("recovery: stock helm's release after its retries: %s; want it still pending", c.after)
			}
		}
	}
	if ours != o.cycles || stock != o.stockCycles {
		t.Errorf("recovery: %d cycles of helm-autorecover, %d of stock helm; want %d and %d", ours, stock, o.cycles, o.stockCycles)
	}
	// Handoff: every one found in the proxy's log.
	if got := len(res.handoff.handoffs); got != o.handoffs {
		t.Errorf("handoff: %d handoffs measured; want %d", got, o.handoffs)
	}
	for _, h := range res.handoff.handoffs {
		if h.released.IsZero() || h.took.IsZero() {
			t.Errorf("handoff %d: release at %v, take at %v; want both seen", h.n, h.released, h.took)
		}
	}
	// Contention: all succeeded, revisions contiguous.
	cr := res.contention
	if n := o.clients * o.upgrades; cr.succeeded() != n || len(cr.upgrades) != n {
		t.Errorf("contention: %d of %d upgrades succeeded; want %d", cr.succeeded(), len(cr.upgrades), n)
	}
	if want := 2 + o.soloRuns + o.clients*o.upgrades; !cr.contiguous || cr.revisions != want || cr.badStatus {
		t.Errorf("contention: %d revisions (%s), contiguous %v; want %d contiguous, the last deployed", cr.revisions, cr.statuses, cr.contiguous, want)
	}
	// Preempt: every holder stopped (exit 11), found in the proxy's log,
	// and silent after the preemptor's take.
	if got := len(res.preempt.runs); got != o.preempts {
		t.Errorf("preempt: %d preemptions measured; want %d", got, o.preempts)
	}
	for _, r := range res.preempt.runs {
		if r.holderExit != exitcode.Preempted || r.lateHolderWrites != 0 || r.asked.IsZero() || !r.took.After(r.asked) || !r.released.After(r.asked) {
			t.Errorf("preempt %d: holder exit %d, %d holder writes after the take, request %v, release %v, take %v; want exit %d, none, and the request first",
				r.n, r.holderExit, r.lateHolderWrites, r.asked, r.released, r.took, exitcode.Preempted)
		}
	}

	// The files: the document keeps what was there and has every
	// scenario's block once; every plot is a PNG; every CSV parses.
	b, err := os.ReadFile(o.doc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, before) {
		t.Errorf("the document lost what it had before:\n%.300s", doc)
	}
	for _, name := range scenarioNames {
		if n := strings.Count(doc, beginScenario(name)); n != 1 {
			t.Errorf("the document has %d blocks of %s; want 1", n, name)
		}
	}
	if strings.Contains(doc, "not measured yet") {
		t.Errorf("a scenario's block was not written:\n%s", doc)
	}
	for _, f := range []string{"overhead.png", "overhead-requests.png", "recovery.png", "handoff.png", "contention.png", "preempt.png"} {
		if !strings.Contains(doc, "](bench/"+f+")") {
			t.Errorf("the document does not show %s", f)
		}
		fh, err := os.Open(filepath.Join(o.data, f))
		if err != nil {
			t.Error(err)
			continue
		}
		if _, err := png.DecodeConfig(fh); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		_ = fh.Close()
	}
	numeric := map[string][]string{
		"overhead.csv":          {"run", "seconds"},
		"overhead-requests.csv": {"run", "requests"},
		"recovery.csv":          {"lease_s", "cycle", "kill_delay_s", "seconds_after_kill"},
		"handoff.csv":           {"handoff", "gap_s", "gap_from_exit_s", "waiter_writes_while_queued"},
		"contention.csv":        {"seconds", "exit"},
		"preempt.csv":           {"request_to_take_s", "request_to_holder_release_s", "holder_exit", "preemptor_wall_s"},
	}
	for f, cols := range numeric {
		checkCSV(t, filepath.Join(o.data, f), cols)
		if !strings.Contains(doc, "](bench/"+f+")") {
			t.Errorf("the document does not link %s", f)
		}
	}
}

// checkCSV reads a CSV file and parses the named columns of every row as
// numbers.
func checkCSV(t *testing.T, path string, cols []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = f.Close() }()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if len(rows) < 2 {
		t.Errorf("%s: %d rows; want a header and data", path, len(rows))
		return
	}
	for _, col := range cols {
		i := slices.Index(rows[0], col)
		if i < 0 {
			t.Errorf("%s: no column %q in %v", path, col, rows[0])
			continue
		}
		for _, r := range rows[1:] {
			if _, err := strconv.ParseFloat(r[i], 64); err != nil {
				t.Errorf("%s: column %s: %v", path, col, err)
				break
			}
		}
	}
}

// TestWriteSection: the suite's block is appended once, and a scenario's
// rerun replaces its block alone.
func TestWriteSection(t *testing.T) {
	dir := t.TempDir()
	s := &suite{o: options{family: benchFamily, doc: filepath.Join(dir, "docs", "benchmarks.md"), data: filepath.Join(dir, "docs", "bench")}}
	if err := os.MkdirAll(filepath.Dir(s.o.doc), 0o755); err != nil {
		t.Fatal(err)
	}
	const before = "# Benchmarks\n\nkept\n"
	if err := os.WriteFile(s.o.doc, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct{ scenario, text string }{
		{"handoff", "first handoff"},
		{"overhead", "first overhead"},
		{"handoff", "second handoff"},
	}
	for _, st := range steps {
		if err := s.writeSection(st.scenario, section{markdown: st.text}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(s.o.doc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{before, "second handoff", "first overhead", "_recovery: not measured yet._"} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "first handoff") {
		t.Errorf("the rerun of handoff did not replace its block:\n%s", doc)
	}
	if n := strings.Count(doc, beginSuite); n != 1 {
		t.Errorf("%d suite blocks; want 1", n)
	}
	// A scenario the block was written without (one added since) gets a
	// block of its own, last in the suite's.
	doc = strings.Replace(doc, beginScenario("contention"), "", 1)
	doc = strings.Replace(doc, benchFamily.endScenario("contention"), "", 1)
	if err := os.WriteFile(s.o.doc, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.writeSection("contention", section{markdown: "new contention"}); err != nil {
		t.Fatalf("a scenario missing from the block: %v", err)
	}
	if b, err = os.ReadFile(s.o.doc); err != nil {
		t.Fatal(err)
	}
	doc = string(b)
	if i, j := strings.Index(doc, "new contention"), strings.Index(doc, endSuite); i < 0 || j < i || strings.Count(doc, beginScenario("contention")) != 1 || !strings.Contains(doc, "second handoff") {
		t.Errorf("the added scenario's block is not once inside the suite's:\n%s", doc)
	}
	if got := s.dataLink("handoff.png"); got != "bench/handoff.png" {
		t.Errorf("dataLink = %q; want bench/handoff.png", got)
	}
}

// TestChaosSmoke runs a few cases of the fault suite (make chaos) so that
// `make test` keeps it from rotting: an upgrade killed after its pending
// write and a rollback killed in its pre-hook, under each backend, and an
// install killed while recovery marks its abandoned revision failed. Each
// case must reach its point, be recovered by the next operation, and leave
// a clean history with no overlapping holders in the audit log.
func TestChaosSmoke(t *testing.T) {
	env := testenv.Get(t)
	dir := t.TempDir()
	o := defaults()
	o.family = chaosFamily
	o.bin, o.helm, o.kubeconfig = env.ChaosBin(t), env.Helm4, env.Kubeconfig
	o.doc, o.data = filepath.Join(dir, "reliability.md"), filepath.Join(dir, "reliability")
	o.chaos.chart = filepath.Join(env.RepoRoot, o.chaos.chart)
	o.chaos.auditLog = filepath.Join(filepath.Dir(env.Kubeconfig), "logs", "audit.log")
	o.scenarios = []string{"kill"}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, c := range []struct{ ops, points, backends []string }{
		{[]string{"upgrade", "rollback"}, []string{"after-pending-write", "pre-hook"}, []string{"release", "lease"}},
		{[]string{"install"}, []string{"recovery"}, []string{"release"}},
	} {
		o.chaos.ops, o.chaos.points, o.chaos.backends = c.ops, c.points, c.backends
		res, err := run(ctx, o)
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		r := res.chaos["kill"]
		if want := len(c.ops) * len(c.points) * len(c.backends); r == nil || r.cases != want {
			t.Fatalf("chaos kill: %v cases; want %d", r, want)
		}
		if r.violations != 0 {
			t.Errorf("chaos kill: %d violations:\n%s", r.violations, strings.Join(r.lines, "\n"))
		}
	}
	doc, err := os.ReadFile(o.doc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "### Kill matrix") || !strings.Contains(string(doc), chaosFamily.beginScenario("kill")) {
		t.Errorf("%s lacks the kill matrix:\n%s", o.doc, doc)
	}
}
