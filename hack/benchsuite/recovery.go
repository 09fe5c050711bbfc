package main

import (
	"context"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The recovery scenario: an upgrade --wait that never ends (its pods match
// no node) is killed with SIGKILL after its pending revision appeared, and
// the upgrade is run again at once. helm-autorecover's retry waits for the
// dead holder's lock with --lock-timeout and recovers; stock helm's retry is
// refused, again and again, through the same window.

// unschedulable keeps an upgrade's pods Pending: --wait never ends.
var unschedulable = []string{"--set", "nodeSelector.never=matches"}

// refusal is what stock helm says of a release left pending.
const refusal = "another operation (install/upgrade/rollback) is in progress"

// recoveryCycle is one kill and what followed.
type recoveryCycle struct {
	lease     time.Duration
	client    string // ours or stock
	cycle     int
	killDelay time.Duration // from the pending revision seen to the kill
	// ours: the retry's end, from the kill; its exit code.
	killToSuccess float64
	exit          int
	// stock: each retry's end from the kill, and whether it was refused
	// as "another operation is in progress".
	attempts []float64
	refused  []bool
	// after: the history afterwards, "rev:status ..."
	after string
}

type recoveryResult struct {
	cycles []recoveryCycle
}

// window is how long stock helm's retries go on after a kill: the goal of
// helm-autorecover's kill-to-success.
func window(lease time.Duration) time.Duration { return lease + 2*time.Second }

func (s *suite) recovery(ctx context.Context) (*recoveryResult, error) {
	ns, err := s.namespace(ctx, "recovery")
	if err != nil {
		return nil, err
	}
	res := &recoveryResult{}
	for _, lease := range s.o.leases {
		fmt.Fprintf(os.Stderr, "  lease %s: %d cycles of helm-autorecover, %d of stock helm\n", lease, s.o.cycles, s.o.stockCycles)
		cycles, err := s.recoveryOurs(ctx, ns, lease)
		res.cycles = append(res.cycles, cycles...)
		if err != nil {
			return res, err
		}
		cycles, err = s.recoveryStock(ctx, ns, lease)
		res.cycles = append(res.cycles, cycles...)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// killDelay spreads the kills over the renewal period (a third of the
// lease): 0, 1/8, 2/8 or 3/8 of the lease after the pending revision
// appeared.
func killDelay(lease time.Duration, cycle int) time.Duration {
	return time.Duration(cycle%4) * lease / 8
}

// killDuringWait starts bin's upgrade --wait of rel (to revision rev) that
// never ends, waits for its pending revision, then for delay, and kills it.
func (s *suite) killDuringWait(ctx context.Context, bin, ns, rel string, rev int, flags []string, delay time.Duration, tag string) (time.Time, error) {
	args := append([]string{"upgrade", rel, s.o.smallChart, "-n", ns, "--wait", "--timeout", "10m", "--set", "message=" + tag}, unschedulable...)
	p, err := s.start(ctx, "", bin, append(args, flags...)...)
	if err != nil {
		return time.Time{}, err
	}
	if err := s.waitStatus(ctx, ns, rel, rev, "pending-upgrade", 2*time.Minute); err != nil {
		p.kill()
		p.wait()
		return time.Time{}, errors.Join(err, p.err())
	}
	time.Sleep(delay)
	at := time.Now()
	p.kill()
	p.wait()
	return at, nil
}

func (s *suite) recoveryOurs(ctx context.Context, ns string, lease time.Duration) ([]recoveryCycle, error) {
	rel := fmt.Sprintf("ours-%ds", int(lease.Seconds()))
	leaseFlag := []string{"--lease-duration", lease.String()}
	if _, err := s.mustRun(ctx, "", s.o.bin, "install", rel, s.o.smallChart, "-n", ns, "--wait", "--timeout", "5m"); err != nil {
		return nil, err
	}
	rev := 1
	var out []recoveryCycle
	for c := range s.o.cycles {
		cy := recoveryCycle{lease: lease, client: "ours", cycle: c, killDelay: killDelay(lease, c)}
		killed := rev + 1
		killAt, err := s.killDuringWait(ctx, s.o.bin, ns, rel, killed, leaseFlag, cy.killDelay, fmt.Sprintf("killed-%d", c))
		if err != nil {
			return out, err
		}
		// At once: the same upgrade, without the values that hold it.
		p, err := s.run(ctx, "", s.o.bin, append([]string{
			"upgrade", rel, s.o.smallChart, "-n", ns,
			"--lock-timeout", (lease + time.Minute).String(), "--set", fmt.Sprintf("message=retry-%d", c),
		}, leaseFlag...)...)
		if err != nil {
			return out, err
		}
		cy.killToSuccess, cy.exit = p.end.Sub(killAt).Seconds(), p.exit
		rev = killed + 1
		cy.after = s.describeHistory(ctx, ns, rel)
		out = append(out, cy)
		if err := p.err(); err != nil {
			return out, fmt.Errorf("the retry after kill %d (lease %s): %w", c, lease, err)
		}
		if want := fmt.Sprintf("%d:failed %d:deployed", killed, rev); !strings.HasSuffix(cy.after, want) {
			return out, fmt.Errorf("history of %s/%s after kill %d = %s; want it to end %s", ns, rel, c, cy.after, want)
		}
	}
	return out, nil
}

func (s *suite) recoveryStock(ctx context.Context, ns string, lease time.Duration) ([]recoveryCycle, error) {
	var out []recoveryCycle
	for c := range s.o.stockCycles {
		cy := recoveryCycle{lease: lease, client: "stock", cycle: c, killDelay: killDelay(lease, c)}
		// A release each: stock helm's stays stuck for good.
		rel := fmt.Sprintf("stock-%ds-%d", int(lease.Seconds()), c)
		if _, err := s.mustRun(ctx, "", s.o.helm, "install", rel, s.o.smallChart, "-n", ns, "--wait", "--timeout", "5m"); err != nil {
			return out, err
		}
		killAt, err := s.killDuringWait(ctx, s.o.helm, ns, rel, 2, nil, cy.killDelay, "killed")
		if err != nil {
			return out, err
		}
		// At least one retry, however slow the machine.
		for len(cy.attempts) == 0 || time.Since(killAt) < window(lease) {
			p, err := s.run(ctx, "", s.o.helm, "upgrade", rel, s.o.smallChart, "-n", ns, "--set", fmt.Sprintf("message=retry-%d", len(cy.attempts)))
			if err != nil {
				return out, err
			}
			cy.attempts = append(cy.attempts, p.end.Sub(killAt).Seconds())
			cy.refused = append(cy.refused, p.exit != 0 && strings.Contains(p.stderr.String(), refusal))
			time.Sleep(200 * time.Millisecond)
		}
		cy.after = s.describeHistory(ctx, ns, rel)
		out = append(out, cy)
	}
	return out, nil
}

// describeHistory is the history of rel as "rev:status ...".
func (s *suite) describeHistory(ctx context.Context, ns, rel string) string {
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return err.Error()
	}
	parts := make([]string, len(h))
	for i, r := range h {
		parts[i] = fmt.Sprintf("%d:%s", r.number, r.status)
	}
	return strings.Join(parts, " ")
}

// oursSeconds are the kill-to-success times of helm-autorecover's cycles
// under lease.
func (r *recoveryResult) oursSeconds(lease time.Duration) []float64 {
	var out []float64
	for _, c := range r.cycles {
		if c.lease == lease && c.client == "ours" {
			out = append(out, c.killToSuccess)
		}
	}
	return out
}

// stockCycles are stock helm's cycles under lease.
func (r *recoveryResult) stockCycles(lease time.Duration) []recoveryCycle {
	var out []recoveryCycle
	for _, c := range r.cycles {
		if c.lease == lease && c.client == "stock" {
			out = append(out, c)
		}
	}
	return out
}

func (s *suite) recoveryReport(r *recoveryResult) (section, error) {
	var rows [][]string
	for _, c := range r.cycles {
		base := []string{strconv.FormatFloat(c.lease.Seconds(), 'f', -1, 64), c.client, strconv.Itoa(c.cycle), sec3(c.killDelay.Seconds())}
		if c.client == "ours" {
			outcome := "succeeded"
			if c.exit != 0 {
				outcome = fmt.Sprintf("exit %d", c.exit)
			}
			rows = append(rows, append(base, "retry", sec3(c.killToSuccess), outcome, c.after))
			continue
		}
		for i, at := range c.attempts {
			outcome := "other failure or success"
			if c.refused[i] {
				outcome = "refused: another operation is in progress"
			}
			rows = append(rows, append(base, "retry "+strconv.Itoa(i+1), sec3(at), outcome, c.after))
		}
	}
	if err := s.writeCSV("recovery.csv", []string{"lease_s", "client", "cycle", "kill_delay_s", "event", "seconds_after_kill", "outcome", "history_after"}, rows); err != nil {
		return section{}, err
	}
	if err := s.recoveryPlot(r); err != nil {
		return section{}, err
	}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("### Recovery after SIGKILL\n\n")
	p("An `upgrade --wait` of the small chart whose pods match no node (it never ends) is killed with SIGKILL after its pending revision appeared ")
	p("(and 0, 1/8, 2/8 or 3/8 of the lease later, in turn, so the kills fall at different points of the renewal period), then the upgrade is run again at once without the values that hold it (and without `--wait`). ")
	p("helm-autorecover (`--lease-duration` as below, the retry with `--lock-timeout` lease + 1 min) waits for the dead holder's lock to expire, marks the abandoned revision failed and upgrades; the time is from the kill to the retry's exit 0, and every cycle's history is checked (abandoned revision `failed`, the retry's `deployed`). ")
	p("Stock helm, killed the same way on a release of its own, is retried every 200 ms through the window the goal allows helm-autorecover (lease + 2 s).\n\n")
	var trows [][]string
	var summary []string
	for _, lease := range s.o.leases {
		xs := r.oursSeconds(lease)
		over := 0
		for _, x := range xs {
			if x > window(lease).Seconds() {
				over++
			}
		}
		attempts, refused, stuck := 0, 0, 0
		stock := r.stockCycles(lease)
		for _, c := range stock {
			attempts += len(c.attempts)
			for _, ok := range c.refused {
				if ok {
					refused++
				}
			}
			if strings.Contains(c.after, "pending-upgrade") {
				stuck++
			}
		}
		trows = append(trows, []string{
			lease.String(), strconv.Itoa(len(xs)),
			fmt.Sprintf("%s / %s / %s / %s", secs(minOf(xs)), secs(median(xs)), secs(percentile(xs, 0.9)), secs(maxOf(xs))),
			fmt.Sprintf("%s: %d of %d over, %s", secs(window(lease).Seconds()), over, len(xs), verdict(over == 0)),
			fmt.Sprintf("%s: %d of %d retries refused, %d of %d releases still pending after %s", plural(len(stock), "cycle"), refused, attempts, stuck, len(stock), secs(window(lease).Seconds())),
		})
		summary = append(summary, fmt.Sprintf("  lease %s: kill-to-success median %s max %s (goal %s, %d over); stock: %d of %d retries refused",
			lease, secs(median(xs)), secs(maxOf(xs)), secs(window(lease).Seconds()), over, refused, attempts))
	}
	p("%s\n", table([]string{"lease", "cycles", "kill to success: min / median / p90 / max", "goal (lease + 2 s)", "stock helm's retries through the window"}, trows))
	p("%s\n", s.image("Kill to success per cycle, and stock helm's refused retries", "recovery.png"))
	p("%s", s.footer("recovery", []string{fmt.Sprintf("--cycles=%d", s.o.cycles), fmt.Sprintf("--stock-cycles=%d", s.o.stockCycles), "--leases=" + leaseList(s.o.leases)}, "recovery.csv"))
	return section{markdown: b.String(), summary: strings.Join(summary, "\n")}, nil
}

func leaseList(ls []time.Duration) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.String()
	}
	return strings.Join(parts, ",")
}

func minOf(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = math.Min(m, x)
	}
	if len(xs) == 0 {
		return 0
	}
	return m
}

// recoveryPlot: per lease, each cycle's kill to success (blue dots), stock
// helm's retries (grey crosses), and the goal (red dashes).
func (s *suite) recoveryPlot(r *recoveryResult) error {
	p := s.newPlot("Recovery after SIGKILL during upgrade --wait", "--lease-duration", "seconds after the kill")
	var names []string
	for i, lease := range s.o.leases {
		names = append(names, lease.String())
		var ours, stockRefused, stockOther plotter.XYs
		for j, x := range r.oursSeconds(lease) {
			ours = append(ours, plotter.XY{X: float64(i) - 0.15 + jitter(j), Y: x})
		}
		for _, c := range r.stockCycles(lease) {
			for k, at := range c.attempts {
				xy := plotter.XY{X: float64(i) + 0.15 + jitter(c.cycle), Y: at}
				if c.refused[k] {
					stockRefused = append(stockRefused, xy)
				} else {
					stockOther = append(stockOther, xy)
				}
			}
		}
		for _, set := range []struct {
			xys   plotter.XYs
			col   color.Color
			glyph draw.GlyphDrawer
			name  string
		}{
			{ours, colOurs, draw.CircleGlyph{}, "helm-autorecover: retry succeeded"},
			{stockRefused, colStock, draw.CrossGlyph{}, "stock helm: retry refused"},
			{stockOther, colGoal, draw.PlusGlyph{}, "stock helm: retry not refused"},
		} {
			if len(set.xys) == 0 {
				continue
			}
			sc, err := points(set.xys, set.col, set.glyph)
			if err != nil {
				return err
			}
			p.Add(sc)
			if i == 0 || set.name == "stock helm: retry not refused" {
				p.Legend.Add(set.name, sc)
			}
		}
		goal, err := hline(float64(i)-0.4, float64(i)+0.4, window(lease).Seconds(), colGoal, true)
		if err != nil {
			return err
		}
		p.Add(goal)
		if i == 0 {
			p.Legend.Add("goal: lease + 2 s", goal)
		}
	}
	p.NominalX(names...)
	p.Y.Min = 0
	headroom(p, 0.25)
	return s.savePlot(p, "recovery.png", 18*vg.Centimeter, 14*vg.Centimeter)
}

// jitter spreads the points of one column a little, deterministically.
func jitter(i int) float64 { return float64(i%7-3) * 0.02 }
