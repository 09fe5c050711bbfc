package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// killCase is one kill of the kill matrix: an operation killed with
// SIGKILL at a point, then the same operation run again.
type killCase struct {
	op, point, backend string
	reached            bool    // the process reached the point and died of SIGKILL there
	exit               int     // of the operation that followed
	recovery           float64 // seconds from the kill to its success
	lost               int     // revisions missing from the history
	deployed           int     // revisions deployed at the end (want 1; 0 after an uninstall)
	pending            int     // revisions left pending at the end
	overlaps           int     // pairs of clients whose write spans overlap
	recreated          int     // chart objects deleted and created again
	note               string
}

func (k killCase) ok() bool {
	wantDeployed := 1
	if k.op == "uninstall" {
		wantDeployed = 0
	}
	return k.reached && k.exit == 0 && k.lost == 0 && k.deployed == wantDeployed && k.pending == 0 && k.overlaps == 0 && k.recreated == 0
}

// opArgs are the arguments of op on rel: the operation killed (retry
// false) or the one after it (retry true, which waits for the dead
// holder's lock). Every client keeps the whole history (--history-max 0)
// so a lost revision shows.
func (s *suite) opArgs(op, rel, ns, backend string, retry bool) []string {
	chart, _ := filepath.Abs(s.o.chaos.chart)
	var args []string
	switch op {
	case "install":
		args = []string{"install", rel, chart, "--wait", "--set", "message=killed"}
		if retry {
			// A killed install leaves a release behind (pending, or failed
			// once recovered): CI pipelines run upgrade --install.
			args = []string{"upgrade", "--install", rel, chart, "--wait", "--history-max", "0", "--set", "message=retry"}
		}
	case "upgrade":
		args = []string{"upgrade", rel, chart, "--wait", "--history-max", "0", "--set", "message=" + map[bool]string{false: "killed", true: "retry"}[retry]}
	case "rollback":
		args = []string{"rollback", rel, "1", "--wait", "--history-max", "0"}
	case "uninstall":
		args = []string{"uninstall", rel, "--wait"}
		if retry {
			// A kill after helm deleted the records leaves nothing to
			// uninstall: what a pipeline runs again says so and succeeds.
			args = append(args, "--ignore-not-found")
		}
	}
	args = append(args, "--namespace", ns, "--lease-duration", s.o.chaos.lease.String(), "--lock-backend", backend, "--timeout", "2m")
	if retry {
		args = append(args, "--lock-timeout", "2m")
	}
	return args
}

// chaosKill is the kill matrix: every operation killed at every point,
// under each backend; the next operation must succeed by itself.
func (s *suite) chaosKill(ctx context.Context) (*chaosResult, error) {
	ns, err := s.namespace(ctx, "chaos-kill")
	if err != nil {
		return nil, err
	}
	res := &chaosResult{}
	type job struct{ op, point, backend string }
	var jobs []job
	for _, backend := range s.o.chaos.backends {
		for _, op := range s.o.chaos.ops {
			for _, point := range s.o.chaos.points {
				jobs = append(jobs, job{op, point, backend})
			}
		}
	}
	// Cases are independent (a release and users of their own) and spend
	// most of their time waiting for a dead holder's lease: a few run at
	// once.
	cases := make([]killCase, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(1, s.o.chaos.parallel))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				errs[i] = ctx.Err()
				return
			}
			k, err := s.killOnce(ctx, ns, j.op, j.point, j.backend)
			if err != nil {
				errs[i] = fmt.Errorf("kill %s at %s (%s): %w", j.op, j.point, j.backend, err)
				return
			}
			cases[i] = k
			mu.Lock()
			defer mu.Unlock()
			verdict := res.tally(k.ok())
			res.line("kill %-9s %-19s %-7s %-9s reached=%t exit=%d recovery=%.2fs lost=%d deployed=%d pending=%d overlaps=%d recreated=%d %s",
				k.op, k.point, k.backend, verdict, k.reached, k.exit, k.recovery, k.lost, k.deployed, k.pending, k.overlaps, k.recreated, k.note)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.markdown = s.killReport(cases)
	return res, nil
}

// killOnce runs one case of the matrix on a release of its own.
func (s *suite) killOnce(ctx context.Context, ns, op, point, backend string) (killCase, error) {
	k := killCase{op: op, point: point, backend: backend, exit: -1}
	rel := fmt.Sprintf("%s-%s-%s", op, point, shortBackend(backend))
	logFile := filepath.Join(s.dir, "chaos-"+rel+".log")
	setup := "chaos-setup-" + rel
	// The release as the operation finds it.
	switch op {
	case "upgrade", "uninstall":
		if err := s.chaosMust(ctx, setup, s.opArgs("install", rel, ns, backend, true)); err != nil {
			return k, err
		}
	case "rollback":
		if err := s.chaosMust(ctx, setup, s.opArgs("install", rel, ns, backend, true)); err != nil {
			return k, err
		}
		if err := s.chaosMust(ctx, setup, s.opArgs("upgrade", rel, ns, backend, true)); err != nil {
			return k, err
		}
	}
	before, err := s.objectUIDs(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	// The kill. "recovery" is reached by the operation after a kill at
	// after-pending-write, which finds the revision abandoned.
	killAt := point
	if point == "recovery" {
		killAt = "after-pending-write"
	}
	p, err := s.runAs(ctx, "chaos-killed-"+rel, chaosEnv(killAt, logFile), s.opArgs(op, rel, ns, backend, false)...)
	if err != nil {
		return k, err
	}
	if !p.killed() || !logHas(logFile, killAt) {
		k.note = fmt.Sprintf("point %s not reached: exit %d: %s", killAt, p.exit, tail(p.stderr.String(), 300))
		return k, nil
	}
	if point == "recovery" {
		p, err = s.runAs(ctx, "chaos-killed2-"+rel, chaosEnv(point, logFile), s.opArgs(op, rel, ns, backend, true)...)
		if err != nil {
			return k, err
		}
		if !p.killed() || !logHas(logFile, point) {
			k.note = fmt.Sprintf("point %s not reached: exit %d: %s", point, p.exit, tail(p.stderr.String(), 300))
			return k, nil
		}
	}
	k.reached = true
	killedAt := p.end
	afterKill, err := s.objectUIDs(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	// The next operation, by itself.
	next, err := s.runAs(ctx, "chaos-next-"+rel, chaosEnv("", logFile), s.opArgs(op, rel, ns, backend, true)...)
	if err != nil {
		return k, err
	}
	k.exit = next.exit
	k.recovery = next.end.Sub(killedAt).Seconds()
	if next.exit != 0 {
		k.note = tail(next.stderr.String(), 300)
	}
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	k.lost, k.deployed, k.pending = historyCheck(h)
	if op == "uninstall" && len(h) > 0 {
		k.note += fmt.Sprintf(" %d records left after uninstall", len(h))
		k.pending += len(h)
	}
	after, err := s.objectUIDs(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	gone := op == "uninstall"
	if gone && len(after) > 0 {
		k.recreated += len(after)
		k.note += fmt.Sprintf(" objects left after uninstall: %s", strings.Join(sortedKeys(after), ","))
	}
	k.recreated += recreated(before, after, gone)
	k.recreated += recreated(onlyNew(afterKill, before), after, gone)
	spans, err := s.holderSpans(ns, rel)
	if err != nil {
		return k, err
	}
	k.overlaps = overlaps(spans)
	return k, nil
}

// onlyNew are the entries of m whose key is not in old.
func onlyNew(m, old map[string]types.UID) map[string]types.UID {
	out := map[string]types.UID{}
	for key, v := range m {
		if _, ok := old[key]; !ok {
			out[key] = v
		}
	}
	return out
}

// chaosMust runs the chaos binary as user (no fault) and fails unless it
// exits 0.
func (s *suite) chaosMust(ctx context.Context, user string, args []string) error {
	var p *proc
	for range 2 {
		var err error
		if p, err = s.runAs(ctx, user, nil, args...); err != nil {
			return err
		}
		if p.exit == 0 {
			return nil
		}
		// Preparing a case is not under test: a write cut off by the
		// fail-stop on a loaded machine (exit 4) is run again, and the
		// next run recovers what it left.
		fmt.Fprintf(os.Stderr, "chaos: preparing: %v; again\n", p.err())
	}
	return p.err()
}

// killReport is the kill matrix's section.
func (s *suite) killReport(cases []killCase) string {
	var b strings.Builder
	b.WriteString("### Kill matrix\n\n")
	fmt.Fprintf(&b, "Each operation (install, upgrade, rollback, uninstall, all with `--wait` on the chart `%s`) is killed with SIGKILL at each named point of `internal/chaos`, under each lock backend, with `--lease-duration %s`; the point is reached deterministically (the chaos build kills itself there, and logs it). Then the same operation runs again by itself, with `--lock-timeout 2m` (an install is followed by `upgrade --install`, an uninstall by `uninstall --ignore-not-found`), and the case checks: it succeeded; the history has no gap and exactly one `deployed` revision (none after an uninstall) and nothing pending; the chart's ConfigMap and Deployment kept their UIDs (none deleted and created again; gone after an uninstall); and no two clients' write spans of the release overlap in the audit log. `recovery` kills the operation after a kill at `after-pending-write` while it marks the abandoned revision failed; a third operation must then succeed. Time to recovery is from the kill to the next operation's exit.\n\n", filepath.ToSlash(s.o.chaos.chart), s.o.chaos.lease)
	var rows [][]string
	byPoint := map[string]map[string][]killCase{}
	for _, k := range cases {
		if byPoint[k.point] == nil {
			byPoint[k.point] = map[string][]killCase{}
		}
		byPoint[k.point][k.op] = append(byPoint[k.point][k.op], k)
	}
	for _, point := range s.o.chaos.points {
		row := []string{"`" + point + "`"}
		for _, op := range s.o.chaos.ops {
			var cells []string
			for _, k := range byPoint[point][op] {
				if k.ok() {
					cells = append(cells, fmt.Sprintf("%s %.1f s", shortBackend(k.backend), k.recovery))
				} else {
					cells = append(cells, fmt.Sprintf("%s **failed**", shortBackend(k.backend)))
				}
			}
			row = append(row, strings.Join(cells, ", "))
		}
		rows = append(rows, row)
	}
	b.WriteString(table(append([]string{"point"}, s.o.chaos.ops...), rows))
	var rec []float64
	var recovered, reached, lost, twoDeployed, overl, recr int
	for _, k := range cases {
		if k.reached {
			reached++
		}
		if k.reached && k.exit == 0 {
			recovered++
			rec = append(rec, k.recovery)
		}
		lost += k.lost
		if k.deployed > 1 {
			twoDeployed++
		}
		overl += k.overlaps
		recr += k.recreated
	}
	b.WriteString("\n")
	b.WriteString(table([]string{"figure", "measured", "goal"}, [][]string{
		{"kills (points reached)", fmt.Sprintf("%d of %d", reached, len(cases)), "all"},
		{"recovered by the next operation", fmt.Sprintf("%d of %d (%s)", recovered, len(cases), pct(recovered, len(cases))), "100%"},
		{"revisions lost", strconv.Itoa(lost), "0"},
		{"cases with two `deployed` revisions", strconv.Itoa(twoDeployed), "0"},
		{"overlapping holders (audit log)", strconv.Itoa(overl), "0"},
		{"chart objects deleted and created again", strconv.Itoa(recr), "0"},
		{"kill to recovery: median / p90 / max", fmt.Sprintf("%.2f / %.2f / %.2f s", median(rec), percentile(rec, 0.9), maxOf(rec)), fmt.Sprintf("lease (%s) + the operation", s.o.chaos.lease)},
	}))
	var failed []string
	for _, k := range cases {
		if !k.ok() {
			failed = append(failed, fmt.Sprintf("- %s at `%s` (%s): %s", k.op, k.point, k.backend, strings.TrimSpace(k.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("kill", "--chaos-points="+strings.Join(s.o.chaos.points, ",")))
	return b.String()
}

func pct(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(of))
}

// chaosFooter ends a group's section: when, where, with what, and the
// command that runs it again.
func (s *suite) chaosFooter(scenario string, flags ...string) string {
	cmd := "make chaos CHAOS_FLAGS='--scenarios=" + scenario
	if fl := slices.DeleteFunc(slices.Clone(flags), func(f string) bool { return f == "" }); len(fl) > 0 {
		cmd += " " + strings.Join(fl, " ")
	}
	cmd += "'"
	return fmt.Sprintf("Measured %s on %s; %s. Rerun: `%s` (`make chaos` runs every group; `LOCAL_CLUSTER_DIR` chooses the cluster).\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), s.machine.hardware(), s.machine.versions(), cmd)
}
