package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
)

// replot draws the plots of the scenarios o names again from the CSV the
// last run wrote in o.data, without a cluster and without touching the
// document: for a change to how they are drawn. The subtitle is read from
// the document's caption of each scenario (its date, cores and versions).
func replot(o options) error {
	doc, err := os.ReadFile(o.doc)
	if err != nil {
		return fmt.Errorf("replot reads the subtitles from the document: %w", err)
	}
	s := &suite{o: o}
	for _, name := range o.scenarios {
		s.plotNote = captionNote(string(doc), name)
		switch name {
		case "overhead":
			r, err := readOverhead(s)
			if err == nil {
				err = s.overheadPlots(r)
			}
			if err != nil {
				return fmt.Errorf("replot overhead: %w", err)
			}
		case "recovery":
			r, err := readRecovery(s)
			if err == nil {
				err = s.recoveryPlot(r)
			}
			if err != nil {
				return fmt.Errorf("replot recovery: %w", err)
			}
		case "handoff":
			rows, err := readCSV(s, "handoff.csv")
			if err != nil {
				return fmt.Errorf("replot handoff: %w", err)
			}
			var gaps, exitGaps []float64
			for _, r := range rows {
				gaps = append(gaps, r.float("gap_s"))
				exitGaps = append(exitGaps, r.float("gap_from_exit_s"))
			}
			if err := firstErr(rows); err != nil {
				return fmt.Errorf("replot handoff: %w", err)
			}
			if err := s.handoffPlot(gaps, exitGaps); err != nil {
				return fmt.Errorf("replot handoff: %w", err)
			}
		case "preempt":
			rows, err := readCSV(s, "preempt.csv")
			if err != nil {
				return fmt.Errorf("replot preempt: %w", err)
			}
			var takes, releases []float64
			for _, r := range rows {
				takes = append(takes, r.float("request_to_take_s"))
				releases = append(releases, r.float("request_to_holder_release_s"))
			}
			if err := firstErr(rows); err != nil {
				return fmt.Errorf("replot preempt: %w", err)
			}
			if err := s.preemptPlot(takes, releases); err != nil {
				return fmt.Errorf("replot preempt: %w", err)
			}
		case "contention":
			r, err := readContention(s)
			if err == nil {
				err = s.contentionPlot(r)
			}
			if err != nil {
				return fmt.Errorf("replot contention: %w", err)
			}
		default:
			return fmt.Errorf("replot: scenario %q has no plot", name)
		}
		fmt.Fprintf(os.Stderr, "benchsuite: replotted %s from %s\n", name, o.data)
	}
	return nil
}

var (
	captionMeasured = regexp.MustCompile(`Measured (\d{4}-\d\d-\d\d) [0-9:]+ UTC on (\d+ cores)`)
	captionOurs     = regexp.MustCompile(`helm-autorecover ([0-9a-z.-]+), stock helm`)
	captionStock    = regexp.MustCompile(`stock helm (v[0-9.]+)`)
)

// captionNote is the subtitle of a scenario's plot, from the caption the
// run wrote under it ("Measured DATE TIME UTC on N cores ...; helm-autorecover
// X, stock helm Y, ..."): what it can find of it.
func captionNote(doc, scenario string) string {
	begin, end := benchFamily.beginScenario(scenario), benchFamily.endScenario(scenario)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return ""
	}
	block := doc[i:j]
	var parts []string
	if m := captionMeasured.FindStringSubmatch(block); m != nil {
		parts = append(parts, "measured "+m[1], m[2])
	}
	var builds []string
	if m := captionOurs.FindStringSubmatch(block); m != nil {
		builds = append(builds, "helm-autorecover "+m[1])
	}
	if m := captionStock.FindStringSubmatch(block); m != nil {
		builds = append(builds, "stock helm "+m[1])
	}
	if len(builds) > 0 {
		parts = append(parts, strings.Join(builds, ", "))
	}
	return strings.Join(parts, "; ")
}

// csvRow is one row of a CSV file, read by its header's names; the first
// value that does not parse is kept in err.
type csvRow struct {
	file  string
	line  int
	index map[string]int
	vals  []string
	err   *error
}

func (r csvRow) str(col string) string {
	i, ok := r.index[col]
	if !ok || i >= len(r.vals) {
		r.fail(fmt.Errorf("%s:%d: no column %q", r.file, r.line, col))
		return ""
	}
	return r.vals[i]
}

func (r csvRow) float(col string) float64 {
	v := r.str(col)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		r.fail(fmt.Errorf("%s:%d: %s: %w", r.file, r.line, col, err))
	}
	return f
}

func (r csvRow) int(col string) int { return int(r.float(col)) }

func (r csvRow) bool(col string) bool { return r.str(col) == "true" }

func (r csvRow) fail(err error) {
	if *r.err == nil {
		*r.err = err
	}
}

func firstErr(rows []csvRow) error {
	if len(rows) == 0 {
		return nil
	}
	return *rows[0].err
}

// readCSV reads file of the data folder into rows sharing one error.
func readCSV(s *suite, file string) ([]csvRow, error) {
	f, err := os.Open(s.dataPath(file))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(recs) < 2 {
		return nil, fmt.Errorf("%s: no rows", file)
	}
	index := map[string]int{}
	for i, h := range recs[0] {
		index[h] = i
	}
	var shared error
	rows := make([]csvRow, 0, len(recs)-1)
	for i, rec := range recs[1:] {
		rows = append(rows, csvRow{file: file, line: i + 2, index: index, vals: rec, err: &shared})
	}
	return rows, nil
}

func readOverhead(s *suite) (*overheadResult, error) {
	r := &overheadResult{}
	caseOf := func(row csvRow) overheadCase {
		c := overheadCase{op: row.str("op"), chart: row.str("chart"), wait: row.bool("wait")}
		if !slices.Contains(r.cases, c) {
			r.cases = append(r.cases, c)
		}
		return c
	}
	rows, err := readCSV(s, "overhead.csv")
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		r.runs = append(r.runs, overheadRun{c: caseOf(row), client: row.str("client"), run: row.int("run"), seconds: row.float("seconds"), proxied: row.str("via") == "proxy"})
	}
	if err := firstErr(rows); err != nil {
		return nil, err
	}
	if rows, err = readCSV(s, "overhead-requests.csv"); err != nil {
		return nil, err
	}
	at := map[string]int{} // case, client, run -> index in r.counts
	for _, row := range rows {
		c, client, run := caseOf(row), row.str("client"), row.int("run")
		k := fmt.Sprintf("%s|%s|%d", c, client, run)
		i, ok := at[k]
		if !ok {
			i = len(r.counts)
			at[k] = i
			r.counts = append(r.counts, overheadCount{c: c, client: client, run: run, counts: map[countproxy.Key]int{}})
		}
		r.counts[i].counts[countproxy.Key{Verb: row.str("verb"), Resource: row.str("resource"), Meta: row.bool("metadata_only")}] += row.int("requests")
	}
	return r, firstErr(rows)
}

func readRecovery(s *suite) (*recoveryResult, error) {
	rows, err := readCSV(s, "recovery.csv")
	if err != nil {
		return nil, err
	}
	r := &recoveryResult{}
	at := map[string]int{}
	s.o.leases = nil
	for _, row := range rows {
		lease := time.Duration(row.float("lease_s") * float64(time.Second))
		if !slices.Contains(s.o.leases, lease) {
			s.o.leases = append(s.o.leases, lease)
		}
		client, cycle := row.str("client"), row.int("cycle")
		k := fmt.Sprintf("%s|%s|%d", lease, client, cycle)
		i, ok := at[k]
		if !ok {
			i = len(r.cycles)
			at[k] = i
			r.cycles = append(r.cycles, recoveryCycle{
				lease: lease, client: client, cycle: cycle,
				killDelay: time.Duration(row.float("kill_delay_s") * float64(time.Second)), after: row.str("history_after"),
			})
		}
		c := &r.cycles[i]
		outcome := row.str("outcome")
		if client == "ours" {
			c.killToSuccess = row.float("seconds_after_kill")
			if outcome != "succeeded" {
				c.exit, _ = strconv.Atoi(strings.TrimPrefix(outcome, "exit "))
			}
			continue
		}
		c.attempts = append(c.attempts, row.float("seconds_after_kill"))
		c.refused = append(c.refused, strings.HasPrefix(outcome, "refused"))
	}
	return r, firstErr(rows)
}

func readContention(s *suite) (*contentionResult, error) {
	rows, err := readCSV(s, "contention.csv")
	if err != nil {
		return nil, err
	}
	r := &contentionResult{start: time.Unix(0, 0)}
	at := func(sec float64) time.Time { return r.start.Add(time.Duration(sec * float64(time.Second))) }
	r.end = r.start
	for _, row := range rows {
		if row.str("kind") == "alone" {
			r.solo = append(r.solo, row.float("seconds"))
			r.soloCPU = append(r.soloCPU, row.float("cpu_s"))
			continue
		}
		u := contentionUpgrade{client: row.int("client"), n: row.int("upgrade"), start: at(row.float("start_s")), end: at(row.float("end_s")), exit: row.int("exit"), cpu: row.float("cpu_s")}
		r.upgrades = append(r.upgrades, u)
		if u.end.After(r.end) {
			r.end = u.end
		}
	}
	return r, firstErr(rows)
}
