package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func init() { chaosScenarios["pause"] = (*suite).chaosPause }

// pauseKinds are the pause group's cases, per backend:
//
//   - pause: the holder is stopped (SIGSTOP) for twice its lease, another
//     client takes over, then the holder is continued;
//   - sleep: the same, as a simulated system sleep of twice the lease
//     (HELM_AUTORECOVER_CHAOS_SUSPEND_AT): the boot-time clock also says
//     the machine slept;
//   - sleep-boottime: a simulated system sleep of twice the lease that only
//     the boot-time clock sees: the holder is continued at once, so its
//     monotonic clock barely moved and nobody took over on the server.
var pauseKinds = []string{"pause", "sleep", "sleep-boottime"}

// pausePoint is where the holder stops: the lock is taken and the pending
// revision written, helm has created the chart's pre-upgrade hook. (Not
// "apply": the chaos build's transport also sees the lock's own write of
// the beat Secret, which it counts as the first object applied.)
const pausePoint = "pre-hook"

// pauseCase is one case of the pause group.
type pauseCase struct {
	kind, backend string
	reached       bool    // the holder stopped at pausePoint
	held          float64 // seconds the holder was kept stopped
	takerExit     int     // of the client that took over (or came next)
	takeover      float64 // seconds the taker ran
	holderExit    int     // of the holder once continued (want exitcode.LockLost)
	holderStop    float64 // seconds from SIGCONT to the holder's exit
	lateWrites    int     // the holder's writes after the takeover (or after waking)
	lost          int
	deployed      int
	pending       int
	overlaps      int
	note          string
}

func (c pauseCase) ok() bool {
	return c.reached && c.takerExit == 0 && c.holderExit == exitcode.LockLost && c.lateWrites == 0 &&
		c.lost == 0 && c.deployed == 1 && c.pending == 0 && c.overlaps == 0
}

// chaosPause stops (or puts to simulated sleep) a holder for twice its
// lease while another client takes over; once continued, the holder must
// exit with its lost-lock code and write nothing more.
func (s *suite) chaosPause(ctx context.Context) (*chaosResult, error) {
	ns, err := s.namespace(ctx, "chaos-pause")
	if err != nil {
		return nil, err
	}
	res := &chaosResult{}
	var cases []pauseCase
	for _, backend := range s.o.chaos.backends {
		for _, kind := range pauseKinds {
			c, err := s.pauseOnce(ctx, ns, kind, backend)
			if err != nil {
				return res, fmt.Errorf("pause %s (%s): %w", kind, backend, err)
			}
			cases = append(cases, c)
			verdict := res.tally(c.ok())
			res.line("pause %-14s %-7s %-9s reached=%t held=%.2fs taker-exit=%d takeover=%.2fs holder-exit=%d holder-stop=%.2fs late-writes=%d lost=%d deployed=%d pending=%d overlaps=%d %s",
				kind, backend, verdict, c.reached, c.held, c.takerExit, c.takeover, c.holderExit, c.holderStop, c.lateWrites, c.lost, c.deployed, c.pending, c.overlaps, c.note)
		}
	}
	res.markdown = s.pauseReport(cases)
	return res, nil
}

// pauseOnce runs one case on a release of its own.
func (s *suite) pauseOnce(ctx context.Context, ns, kind, backend string) (pauseCase, error) {
	c := pauseCase{kind: kind, backend: backend, takerExit: -1, holderExit: -1}
	lease := s.o.chaos.lease
	rel := fmt.Sprintf("%s-%s", kind, shortBackend(backend))
	logFile := filepath.Join(s.dir, "chaos-"+rel+".log")
	if err := s.chaosMust(ctx, "chaos-setup-"+rel, s.opArgs("install", rel, ns, backend, true)); err != nil {
		return c, err
	}
	holderUser := "chaos-holder-" + rel
	env := chaosEnv("", logFile)
	if kind == "pause" {
		env = append(env, "HELM_AUTORECOVER_CHAOS_STOP_AT="+pausePoint)
	} else {
		env = append(env, fmt.Sprintf("HELM_AUTORECOVER_CHAOS_SUSPEND_AT=%s:%s", pausePoint, 2*lease))
	}
	holder, err := s.startAs(ctx, holderUser, env, s.opArgs("upgrade", rel, ns, backend, false)...)
	if err != nil {
		return c, err
	}
	defer holder.kill() // a no-op once it has exited
	if err := waitStopped(ctx, holder); err != nil {
		c.note = fmt.Sprintf("point %s not reached: %v: %s", pausePoint, err, tail(holder.stderr.String(), 1200))
		return c, nil
	}
	if c.note, err = s.pendingNote(ctx, ns, rel); err != nil || c.note != "" {
		return c, err
	}
	c.reached = true
	stoppedAt := time.Now()
	takerUser := "chaos-taker-" + rel
	var taker *proc
	if kind != "sleep-boottime" {
		// The scenario is about time: the holder stays stopped for twice
		// its lease, then another client takes the release over.
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-time.After(2 * lease):
		}
		if taker, err = s.runAs(ctx, takerUser, chaosEnv("", logFile), s.opArgs("upgrade", rel, ns, backend, true)...); err != nil {
			return c, err
		}
	}
	c.held = time.Since(stoppedAt).Seconds()
	contAt := time.Now()
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return c, fmt.Errorf("continuing the holder: %w", err)
	}
	select {
	case <-holder.done:
	case <-time.After(2 * time.Minute):
		holder.kill()
		<-holder.done
		c.note += " holder still running 2m after SIGCONT (killed);"
	}
	c.holderExit = holder.exit
	c.holderStop = holder.end.Sub(contAt).Seconds()
	if c.holderExit != exitcode.LockLost {
		c.note += " holder: " + errorLine(holder.stderr.String())
	}
	if taker == nil {
		// Nobody took over while it slept: the next client recovers the
		// revision it left pending once its lock has expired.
		if taker, err = s.runAs(ctx, takerUser, chaosEnv("", logFile), s.opArgs("upgrade", rel, ns, backend, true)...); err != nil {
			return c, err
		}
	}
	c.takerExit = taker.exit
	c.takeover = taker.elapsed().Seconds()
	if taker.exit != 0 {
		c.note += " taker: " + errorLine(taker.stderr.String())
	}
	rc, err := s.checkRelease(ctx, ns, rel)
	if err != nil {
		return c, err
	}
	c.lost, c.deployed, c.pending, c.overlaps = rc.lost, rc.deployed, rc.pending, rc.overlaps
	spans := rc.spans
	// The holder's late writes: after the taker's first write of the
	// release, or (sleep-boottime, nobody took over while it slept) after
	// it woke.
	since := contAt
	if kind != "sleep-boottime" {
		since = time.Time{}
		for _, sp := range spans {
			if sp.user == takerUser {
				since = sp.first
			}
		}
		if since.IsZero() {
			c.note += " the taker wrote nothing;"
			since = contAt
		}
	}
	late, err := s.writesSince(ns, holderUser, since)
	if err != nil {
		return c, err
	}
	c.lateWrites = len(late)
	if len(late) > 0 {
		c.note += " late writes: " + strings.Join(late, ", ")
	}
	return c, nil
}

// pendingNote says what is wrong when the latest revision of rel is not
// pending ("" when it is): a holder stopped mid-operation left it so.
func (s *suite) pendingNote(ctx context.Context, ns, rel string) (string, error) {
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return "", err
	}
	if len(h) == 0 {
		return "no revision while the holder is stopped", nil
	}
	if _, _, pending := historyCheck(h[len(h)-1:]); pending == 0 {
		return fmt.Sprintf("revision %d is %s, not pending, while the holder is stopped", h[len(h)-1].number, h[len(h)-1].status), nil
	}
	return "", nil
}

// writesSince lists user's successful writes in ns (Secrets and Leases:
// release records, the Lease, the beat) received by the API server at or
// after t, by the audit log.
func (s *suite) writesSince(ns, user string, t time.Time) ([]string, error) {
	evs, err := testenv.ReadAuditWrites(s.o.chaos.auditLog, ns)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs {
		if e.ImpersonatedUser.Username == user && !e.RequestReceived.Before(t) {
			out = append(out, fmt.Sprintf("%s %s/%s at %s", e.Verb, e.ObjectRef.Resource, e.ObjectRef.Name, e.RequestReceived.Format("15:04:05.000")))
		}
	}
	return out, nil
}

// procState is the state letter of process pid (/proc/PID/stat): 'T' when
// stopped, 'Z' when it has exited and awaits its parent.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return b[i+2], nil
}

// waitStopped waits until p has stopped itself (a chaos STOP_AT or
// SUSPEND_AT point); it fails when p exits first.
func waitStopped(ctx context.Context, p *proc) error {
	errExited := errors.New("exited")
	err := waitFor(ctx, "the process to stop", 3*time.Minute, 10*time.Millisecond, func() (bool, error) {
		select {
		case <-p.done:
			return false, errExited
		default:
		}
		st, err := procState(p.cmd.Process.Pid)
		return err == nil && st == 'T', nil
	})
	if errors.Is(err, errExited) {
		return fmt.Errorf("exit %d before stopping", p.exit)
	}
	return err
}

// pauseReport is the pause group's section.
func (s *suite) pauseReport(cases []pauseCase) string {
	var b strings.Builder
	lease := s.o.chaos.lease
	b.WriteString("### Pause and system sleep\n\n")
	fmt.Fprintf(&b, "A holder runs `upgrade --wait` (chart `%s`, `--lease-duration %s`) and stops itself at the point `%s` (lock taken, pending revision written, the pre-upgrade hook created; the case checks that the latest revision is pending while the holder is stopped). "+
		"**pause**: it is kept stopped (SIGSTOP, the state `T` read from `/proc/PID/stat`) for twice its lease (%s); another client then runs the upgrade with `--lock-timeout 2m` and must take over; then the holder gets SIGCONT. "+
		"**sleep**: the same as a simulated system sleep: the holder runs with `HELM_AUTORECOVER_CHAOS_SUSPEND_AT=%s:%s`, which stops it there and, once continued, makes `internal/sleepclock` read %s more time spent suspended (CLOCK_BOOTTIME less CLOCK_MONOTONIC). "+
		"**sleep-boottime**: the same simulated sleep, but the holder is continued at once: only the boot-time reading says it slept (its monotonic clock moved by the few milliseconds it was stopped), as after a real suspend, and nobody took over on the server (its Lease is still live there); the next client runs after the holder exited. "+
		"Each case checks: the holder exits %d (lost its lock); the audit log shows no successful write (Secrets and Leases: records, Lease, beat) by the holder's impersonated user received after the taker's first write of the release (sleep-boottime: after the holder was continued); the taker succeeded; the history has no gap, one `deployed` revision and nothing pending; no two clients' write spans overlap.\n\n",
		filepath.ToSlash(s.o.chaos.chart), lease, pausePoint, 2*lease, pausePoint, 2*lease, 2*lease, exitcode.LockLost)
	b.WriteString("What the simulated sleep cannot do: a process cannot be suspended the way the machine is. Go reads CLOCK_MONOTONIC (vDSO, no libc) and its timers run on it; it keeps running while a process is stopped, so in **sleep** the holder's monotonic readings already show the whole gap and its overdue renewal timer fires at once on SIGCONT, exactly as in **pause**: the extra boot-time reading is redundant there, and the case proves the end-to-end outcome, not which reading caught it. After a real suspend the monotonic clock stands still and timers are late, so only the boot-time reading can tell. **sleep-boottime** isolates that reading (monotonic gap of milliseconds, boot-time gap of twice the lease) but cannot move the server's clock, so no takeover happens while the holder sleeps; the takeover after a sleep that only the boot-time reading reveals is covered by `internal/lock/suspend_test.go` with `sleepclock.Fake` (the lease expires in the server's clock while the holder's monotonic clock stands still).\n\n")
	var rows [][]string
	for _, c := range cases {
		verdict := "ok"
		if !c.ok() {
			verdict = "**failed**"
		}
		rows = append(rows, []string{
			c.kind, c.backend, verdict, fmt.Sprintf("%.1f s", c.held), fmt.Sprintf("%d, %.1f s", c.takerExit, c.takeover),
			fmt.Sprintf("%d, %.2f s", c.holderExit, c.holderStop), strconv.Itoa(c.lateWrites), strconv.Itoa(c.deployed), strconv.Itoa(c.pending), strconv.Itoa(c.overlaps),
		})
	}
	b.WriteString(table([]string{"case", "backend", "verdict", "held stopped", "taker exit, time", "holder exit, SIGCONT to exit", "holder writes after takeover (goal 0)", "deployed (goal 1)", "pending (goal 0)", "overlaps (goal 0)"}, rows))
	var failed []string
	for _, c := range cases {
		if !c.ok() {
			failed = append(failed, fmt.Sprintf("- %s (%s): %s", c.kind, c.backend, strings.TrimSpace(c.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("pause", "--chaos-lease="+lease.String()))
	return b.String()
}
