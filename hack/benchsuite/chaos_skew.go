package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func init() { chaosScenarios["skew"] = (*suite).chaosSkew }

// skewOffsets are the simulated client clock offsets of the skew group
// (HELM_AUTORECOVER_CHAOS_CLOCK_OFFSET); 0 is the unskewed baseline.
var skewOffsets = []time.Duration{-10 * time.Minute, 0, 10 * time.Minute}

// skewAttempts is how many times a challenger tries a live lock, one lease
// apart.
const skewAttempts = 4

// holdTimeout is the --timeout of an operation held open: far longer than
// any case lasts, so the holder keeps renewing until the case ends it.
const holdTimeout = "2m"

// holdChart is the chart an operation is held open with: its Deployment
// takes a nodeSelector, and one that matches no node keeps its pod Pending,
// so `--wait` does not finish while the holder renews its lock.
func holdChart() string {
	return filepath.Join(testenv.RepoRoot(), "internal", "testenv", "testdata", "charts", "app")
}

// upgradeArgs are the arguments of an upgrade of rel with the hold chart
// (the message value changes something in every revision), followed by
// extra.
func (s *suite) upgradeArgs(rel, ns, backend, message string, extra ...string) []string {
	args := []string{
		"upgrade", rel, holdChart(), "--install", "--history-max", "0", "--set", "message=" + message,
		"--namespace", ns, "--lease-duration", s.o.chaos.lease.String(), "--lock-backend", backend, "--timeout", holdTimeout,
	}
	return append(args, extra...)
}

// holdArgs are the arguments of an upgrade that keeps its lock while
// `--wait` waits for a pod that never schedules.
func (s *suite) holdArgs(rel, ns, backend string) []string {
	return s.upgradeArgs(rel, ns, backend, "hold", "--wait", "--set", "nodeSelector.chaos=nowhere")
}

// waitPoint waits until the chaos log of p names point; an error when p
// ends first.
func waitPoint(ctx context.Context, p *proc, logFile, point string) error {
	return waitFor(ctx, "the holder to reach "+point, 2*time.Minute, 50*time.Millisecond, func() (bool, error) {
		if logHas(logFile, point) {
			return true, nil
		}
		if !p.running() {
			return false, fmt.Errorf("the holder ended (exit %d) before %s: %s", p.exit, point, tail(p.stderr.String(), 300))
		}
		return false, nil
	})
}

// running reports whether p has not ended yet.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// endWithin waits up to d for p to end by itself, and reports whether it
// did.
func (p *proc) endWithin(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// spanOf is user's span among spans.
func spanOf(spans []span, user string) (span, bool) {
	for _, sp := range spans {
		if sp.user == user {
			return sp, true
		}
	}
	return span{}, false
}

// clockEnv is the environment of a client whose wall clock is off by
// offset, logging the points it reaches to logFile.
func clockEnv(offset time.Duration, logFile string) []string {
	return append(chaosEnv("", logFile), "HELM_AUTORECOVER_CHAOS_CLOCK_OFFSET="+offset.String())
}

// durName names a signed duration in a release name: m10m, 0, p5s.
func durName(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	sign := "p"
	if d < 0 {
		sign = "m"
	}
	n := d.Abs().String()
	if strings.HasSuffix(n, "m0s") {
		n = strings.TrimSuffix(n, "0s")
	}
	return sign + n
}

// signed formats an offset or shift with its sign: -10m0s, 0s, +5s.
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// skewCase is one client clock offset under one backend.
type skewCase struct {
	backend string
	offset  time.Duration // of the holder, the recovering and the taking client; the challenger has -offset
	// (a) a live holder and a challenger with the opposite skew
	attempts, refused int
	falseTakeovers    int  // challenger tries that succeeded, or the holder's lock lost
	holderAlive       bool // the holder still ran after the last try
	// (c) after the holder's SIGKILL
	recoverExit            int
	killToTake, killToExit float64 // seconds from the kill to the recovering client's first write and exit
	// (b) after a clean release by a client with the opposite skew
	takeExit                int
	takeFirst, takeElapsed  float64 // seconds from the start to the first write, and to the exit
	extraWaits              int     // a free or expired lock not taken at once (exit 3)
	overlaps                int
	lost, deployed, pending int
	note                    string
}

func (k skewCase) ok() bool {
	return k.refused == k.attempts && k.falseTakeovers == 0 && k.holderAlive && k.recoverExit == 0 && k.takeExit == 0 &&
		k.extraWaits == 0 && k.overlaps == 0 && k.lost == 0 && k.deployed == 1 && k.pending == 0
}

// chaosSkew is the client clock skew group: clients whose wall clock is
// ten minutes behind or ahead of the API server's neither take over a live
// lock nor wait extra for a free or expired one.
func (s *suite) chaosSkew(ctx context.Context) (*chaosResult, error) {
	ns, err := s.namespace(ctx, "chaos-skew")
	if err != nil {
		return nil, err
	}
	res := &chaosResult{}
	var cases []skewCase
	for _, backend := range s.o.chaos.backends {
		for _, off := range skewOffsets {
			k, err := s.skewOnce(ctx, ns, backend, off)
			if err != nil {
				return res, fmt.Errorf("skew %s (%s): %w", signed(off), backend, err)
			}
			cases = append(cases, k)
			verdict := res.tally(k.ok())
			res.line("skew %-7s %-7s %-9s refused=%d/%d false-takeovers=%d holder-alive=%t kill-to-take=%.2fs kill-to-exit=%.2fs recover-exit=%d clean-take=%.2fs/%.2fs take-exit=%d extra-waits=%d overlaps=%d lost=%d deployed=%d pending=%d %s",
				signed(k.offset), backend, verdict, k.refused, k.attempts, k.falseTakeovers, k.holderAlive, k.killToTake, k.killToExit, k.recoverExit,
				k.takeFirst, k.takeElapsed, k.takeExit, k.extraWaits, k.overlaps, k.lost, k.deployed, k.pending, k.note)
		}
	}
	res.markdown = s.skewReport(cases)
	return res, nil
}

// skewOnce runs one case on a release of its own: (a) a holder skewed by
// offset keeps its lock through an operation held open while a client
// skewed the other way tries the release skewAttempts times, a lease
// apart, without --lock-timeout; (c) the holder is killed and a client
// skewed by offset runs the release again with --lock-timeout; (b) a
// client skewed the other way upgrades, and at once one skewed by offset,
// without --lock-timeout.
func (s *suite) skewOnce(ctx context.Context, ns, backend string, off time.Duration) (skewCase, error) {
	k := skewCase{backend: backend, offset: off, recoverExit: -1, takeExit: -1}
	rel := fmt.Sprintf("skew-%s-%s", shortBackend(backend), durName(off))
	user := func(role string) string { return "chaos-skew-" + role + "-" + rel }
	logOf := func(role string) string { return filepath.Join(s.dir, "chaos-"+rel+"-"+role+".log") }
	var notes []string
	if err := s.chaosMust(ctx, user("setup"), s.upgradeArgs(rel, ns, backend, "v1", "--wait")); err != nil {
		return k, err
	}
	// (a) A live holder and a challenger with the opposite skew.
	holder, err := s.startAs(ctx, user("holder"), clockEnv(off, logOf("holder")), s.holdArgs(rel, ns, backend)...)
	if err != nil {
		return k, err
	}
	defer holder.kill()
	if err := waitPoint(ctx, holder, logOf("holder"), "wait"); err != nil {
		k.note = err.Error()
		return k, nil
	}
	for i := range skewAttempts {
		if i > 0 {
			time.Sleep(s.o.chaos.lease) // the scenario is about the lease passing
		}
		c, err := s.runAs(ctx, user("challenger"), clockEnv(-off, logOf("challenger")), s.upgradeArgs(rel, ns, backend, "challenge")...)
		if err != nil {
			return k, err
		}
		k.attempts++
		switch c.exit {
		case exitcode.Locked:
			k.refused++
		case 0:
			k.falseTakeovers++
			notes = append(notes, fmt.Sprintf("try %d took the live lock", i+1))
		default:
			notes = append(notes, fmt.Sprintf("try %d: exit %d: %s", i+1, c.exit, tail(c.stderr.String(), 200)))
		}
	}
	k.holderAlive = holder.running()
	if !k.holderAlive {
		if holder.exit == exitcode.LockLost {
			k.falseTakeovers++
		}
		notes = append(notes, fmt.Sprintf("the holder ended with exit %d: %s", holder.exit, tail(holder.stderr.String(), 200)))
	}
	// (c) The holder dies; a client skewed like it recovers.
	holder.kill()
	holder.wait()
	rec, err := s.runAs(ctx, user("recover"), clockEnv(off, logOf("recover")), s.upgradeArgs(rel, ns, backend, "recovered", "--wait", "--lock-timeout", "1m")...)
	if err != nil {
		return k, err
	}
	k.recoverExit = rec.exit
	k.killToExit = rec.end.Sub(holder.end).Seconds()
	switch rec.exit {
	case 0:
	case exitcode.Locked:
		k.extraWaits++
		notes = append(notes, "the recovering client waited out --lock-timeout 1m")
	default:
		notes = append(notes, fmt.Sprintf("recovery: exit %d: %s", rec.exit, tail(rec.stderr.String(), 200)))
	}
	// (b) A clean release by a client skewed the other way, then at once a
	// client skewed like the holder, which must not wait.
	if err := s.chaosMust(ctx, user("prev"), s.upgradeArgs(rel, ns, backend, "prev")); err != nil {
		return k, err
	}
	take, err := s.runAs(ctx, user("take"), clockEnv(off, logOf("take")), s.upgradeArgs(rel, ns, backend, "take")...)
	if err != nil {
		return k, err
	}
	k.takeExit = take.exit
	k.takeElapsed = take.elapsed().Seconds()
	switch take.exit {
	case 0:
	case exitcode.Locked:
		k.extraWaits++
		notes = append(notes, "refused a cleanly released lock")
	default:
		notes = append(notes, fmt.Sprintf("take: exit %d: %s", take.exit, tail(take.stderr.String(), 200)))
	}
	spans, err := s.holderSpans(ns, rel)
	if err != nil {
		return k, err
	}
	k.overlaps = overlaps(spans)
	if sp, ok := spanOf(spans, user("recover")); ok {
		k.killToTake = sp.first.Sub(holder.end).Seconds()
	}
	if sp, ok := spanOf(spans, user("take")); ok {
		k.takeFirst = sp.first.Sub(take.start).Seconds()
	}
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	k.lost, k.deployed, k.pending = historyCheck(h)
	k.note = strings.Join(notes, "; ")
	return k, nil
}

// skewReport is the skew group's section.
func (s *suite) skewReport(cases []skewCase) string {
	var b strings.Builder
	b.WriteString("### Client clock skew\n\n")
	fmt.Fprintf(&b, "How skew is simulated: Go reads the wall clock without libc (vDSO), so a skewed machine cannot be faked from outside the process (no faketime); the chaos build instead adds `HELM_AUTORECOVER_CHAOS_CLOCK_OFFSET` to every wall-clock reading the tool makes (`sleepclock.System`, which the lock and the server-time estimator read) and to helm's own timestamps (`action.Timestamper`). Elapsed time keeps Go's monotonic reading, as on a machine whose clock is set wrong.\n\n")
	fmt.Fprintf(&b, "Each case runs on a release of its own, under each lock backend, with `--lease-duration %s`, for a clock offset of the holder (and of the clients that recover and take after it) of %s: (a) the holder runs `upgrade --wait` on the chart `internal/testenv/testdata/charts/app` with a nodeSelector that matches no node, so it keeps its lock and renews it, while a client whose clock is off the *other* way (20 minutes apart in all) runs `upgrade` on the release without `--lock-timeout` %d times, one lease apart: each try must be refused (exit 3) and the holder must keep running; (c) the holder is killed with SIGKILL and a client skewed like it runs `upgrade --wait --lock-timeout 1m`: it must recover the release (a 10-minute extra wait would run out the minute); (b) a client skewed the other way upgrades and gives the lock back, and at once a client skewed like the holder runs `upgrade` without `--lock-timeout`: it must take the lock at once (exit 0; refused would be an extra wait). Figures from the audit log: kill to the recovering client's first write, and a client's start to its first write; no two clients' write spans may overlap, and the history must end with one `deployed` revision, nothing pending or lost.\n\n",
		s.o.chaos.lease, joinSigned(skewOffsets), skewAttempts)
	var rows [][]string
	var ft, extra, ovl, tries, refused int
	take := map[time.Duration][]float64{}
	rec := map[time.Duration][]float64{}
	for _, k := range cases {
		result := "ok"
		if !k.ok() {
			result = "**failed**"
		}
		rows = append(rows, []string{
			k.backend, signed(k.offset), signed(-k.offset),
			fmt.Sprintf("%d of %d", k.refused, k.attempts), strconv.FormatBool(k.holderAlive),
			fmt.Sprintf("%.2f s", k.killToTake), fmt.Sprintf("%.2f s", k.takeFirst), result,
		})
		ft += k.falseTakeovers
		extra += k.extraWaits
		ovl += k.overlaps
		tries += k.attempts
		refused += k.refused
		if k.recoverExit == 0 {
			rec[k.offset] = append(rec[k.offset], k.killToTake)
		}
		if k.takeExit == 0 {
			take[k.offset] = append(take[k.offset], k.takeFirst)
		}
	}
	b.WriteString(table([]string{"backend", "holder's clock", "challenger's clock", "live lock refused", "holder kept renewing", "kill to recovery's first write", "take after a clean release (start to first write)", "result"}, rows))
	b.WriteString("\n")
	fig := [][]string{
		{"false takeovers of a live lock", fmt.Sprintf("%d (%d of %d tries refused)", ft, refused, tries), "0"},
		{"extra waits (a free or expired lock not taken)", strconv.Itoa(extra), "0"},
		{"overlapping holders (audit log)", strconv.Itoa(ovl), "0"},
	}
	for _, off := range skewOffsets {
		fig = append(fig,
			[]string{fmt.Sprintf("kill to recovery, clock %s: median / max", signed(off)), fmt.Sprintf("%.2f / %.2f s", median(rec[off]), maxOf(rec[off])), fmt.Sprintf("about one lease (%s), as unskewed", s.o.chaos.lease)},
			[]string{fmt.Sprintf("take after a clean release, clock %s: median / max", signed(off)), fmt.Sprintf("%.2f / %.2f s", median(take[off]), maxOf(take[off])), "as unskewed"})
	}
	b.WriteString(table([]string{"figure", "measured", "goal"}, fig))
	var failed []string
	for _, k := range cases {
		if !k.ok() {
			failed = append(failed, fmt.Sprintf("- clock %s (%s): %s", signed(k.offset), k.backend, strings.TrimSpace(k.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("skew", "--chaos-lease="+s.o.chaos.lease.String(), "--chaos-backends="+strings.Join(s.o.chaos.backends, ",")))
	return b.String()
}

// joinSigned lists durations with their signs.
func joinSigned(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, signed(d))
	}
	return strings.Join(out, ", ")
}
