package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
)

func init() { chaosScenarios["dateshift"] = (*suite).chaosDateshift }

// dateShifts are the shifts of the Date header the dateshift group tries:
// the issue's +-5 s, +-30 s and +-10 min, and +2 s, less than what is left
// of a renewed 3 s lease, to bracket the window.
var dateShifts = []time.Duration{-10 * time.Minute, -30 * time.Second, -5 * time.Second, 2 * time.Second, 5 * time.Second, 30 * time.Second, 10 * time.Minute}

// dateShiftRoles are the clients the shifted proxy serves: the challenger
// (its server's clock runs ahead or behind the holder's) or the holder.
var dateShiftRoles = []string{"challenger", "holder"}

// shiftDate is a fault proxy handler that passes every request on and
// shifts the Date header of the answer by shift, as a kube-apiserver
// replica with a wrong clock, or a load balancer's own answer, would.
func shiftDate(shift time.Duration) func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
	return func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		forward.ServeHTTP(&dateShifter{ResponseWriter: w, shift: shift}, r)
	}
}

// dateShifter rewrites the Date header as the answer's header is written.
type dateShifter struct {
	http.ResponseWriter
	shift time.Duration
	wrote bool
}

func (d *dateShifter) WriteHeader(code int) {
	if !d.wrote && code >= 200 {
		d.wrote = true
		h := d.Header()
		t, err := http.ParseTime(h.Get("Date"))
		if err != nil {
			t = time.Now()
		}
		h.Set("Date", t.Add(d.shift).UTC().Format(http.TimeFormat))
	}
	d.ResponseWriter.WriteHeader(code)
}

func (d *dateShifter) Write(b []byte) (int, error) {
	if !d.wrote {
		d.WriteHeader(http.StatusOK)
	}
	return d.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush a watch through the wrapper.
func (d *dateShifter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// shiftCase is one shift of one client's Date headers under one backend.
type shiftCase struct {
	backend, role  string // role: the client behind the shifting proxy
	shift          time.Duration
	challengerExit int
	challengerSecs float64
	holderAlive    bool // the holder still ran when the challenger ended
	holderExit     int  // when it ended by itself (-1: killed at the end)
	holderStop     float64
	overlaps       int
	deployed       int
	note           string
}

// takenOver reports whether the challenger took the live lock: it
// succeeded, or the holder lost its lock, or their writes overlapped.
func (k shiftCase) takenOver() bool {
	return k.challengerExit == 0 || k.holderExit == exitcode.LockLost || k.overlaps > 0
}

func (k shiftCase) ok() bool { return !k.takenOver() && k.holderAlive && k.deployed <= 1 }

// chaosDateshift is the lying-server group: one of two clients reads the
// API server through a proxy that shifts the Date header; a live, renewing
// lock must not be taken over.
func (s *suite) chaosDateshift(ctx context.Context) (*chaosResult, error) {
	ns, err := s.namespace(ctx, "chaos-dateshift")
	if err != nil {
		return nil, err
	}
	res := &chaosResult{}
	var cases []shiftCase
	for _, role := range dateShiftRoles {
		for _, backend := range s.o.chaos.backends {
			for _, shift := range dateShifts {
				k, err := s.dateshiftOnce(ctx, ns, backend, role, shift)
				if err != nil {
					return res, fmt.Errorf("dateshift %s of the %s (%s): %w", signed(shift), role, backend, err)
				}
				cases = append(cases, k)
				verdict := res.tally(k.ok())
				res.line("dateshift %-10s %-7s %-7s %-9s taken-over=%t challenger-exit=%d challenger=%.2fs holder-alive=%t holder-exit=%d holder-stop=%.2fs overlaps=%d deployed=%d %s",
					role, signed(shift), backend, verdict, k.takenOver(), k.challengerExit, k.challengerSecs, k.holderAlive, k.holderExit, k.holderStop, k.overlaps, k.deployed, k.note)
			}
		}
	}
	res.markdown = s.dateshiftReport(cases)
	return res, nil
}

// dateshiftOnce runs one case on a release of its own: a holder keeps its
// lock through an operation held open, and a challenger tries the release
// with --lock-timeout of two leases; role's client reads the API server
// through a proxy that shifts the Date header by shift, the other directly.
func (s *suite) dateshiftOnce(ctx context.Context, ns, backend, role string, shift time.Duration) (shiftCase, error) {
	k := shiftCase{backend: backend, role: role, shift: shift, challengerExit: -1, holderExit: -1}
	rel := fmt.Sprintf("ds-%s-%s-%s", role[:1], shortBackend(backend), durName(shift))
	user := func(r string) string { return "chaos-ds-" + r + "-" + rel }
	logOf := func(r string) string { return filepath.Join(s.dir, "chaos-"+rel+"-"+r+".log") }
	if err := s.chaosMust(ctx, user("setup"), s.upgradeArgs(rel, ns, backend, "v1", "--wait")); err != nil {
		return k, err
	}
	px, err := s.startFaultProxy(shiftDate(shift))
	if err != nil {
		return k, err
	}
	defer px.Close()
	kubeconfig := func(r string) (string, error) {
		if r == role {
			return px.kubeconfig(s, user(r))
		}
		return s.userKubeconfig(user(r))
	}
	hkc, err := kubeconfig("holder")
	if err != nil {
		return k, err
	}
	ckc, err := kubeconfig("challenger")
	if err != nil {
		return k, err
	}
	holder, err := s.startWith(ctx, hkc, chaosEnv("", logOf("holder")), s.o.bin, s.holdArgs(rel, ns, backend)...)
	if err != nil {
		return k, err
	}
	defer holder.kill()
	if err := waitPoint(ctx, holder, logOf("holder"), "wait"); err != nil {
		k.note = err.Error()
		return k, nil
	}
	c, err := s.startWith(ctx, ckc, chaosEnv("", logOf("challenger")), s.o.bin,
		s.upgradeArgs(rel, ns, backend, "challenge", "--lock-timeout", (2*s.o.chaos.lease).String())...)
	if err != nil {
		return k, err
	}
	c.wait()
	k.challengerExit, k.challengerSecs = c.exit, c.elapsed().Seconds()
	k.holderAlive = holder.running()
	var notes []string
	if c.exit != 0 && c.exit != exitcode.Locked {
		notes = append(notes, fmt.Sprintf("challenger: exit %d: %s", c.exit, tail(c.stderr.String(), 200)))
	}
	// A holder whose lock was taken must stop by itself (S5): give it time.
	if c.exit == 0 && k.holderAlive && !holder.endWithin(30*time.Second) {
		notes = append(notes, "the holder still ran 30 s after the challenger took its lock")
	}
	if !holder.running() {
		k.holderExit = holder.exit
		k.holderStop = holder.end.Sub(c.end).Seconds()
		notes = append(notes, fmt.Sprintf("holder: exit %d: %s", holder.exit, tail(holder.stderr.String(), 200)))
	}
	holder.kill()
	holder.wait()
	spans, err := s.holderSpans(ns, rel)
	if err != nil {
		return k, err
	}
	k.overlaps = overlaps(spans)
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return k, err
	}
	_, k.deployed, _ = historyCheck(h)
	k.note = strings.Join(notes, "; ")
	return k, nil
}

// dateshiftReport is the dateshift group's section.
func (s *suite) dateshiftReport(cases []shiftCase) string {
	var b strings.Builder
	lease := s.o.chaos.lease
	b.WriteString("### Skewed or lying servers (shifted `Date` headers)\n\n")
	fmt.Fprintf(&b, "How the shift is simulated: one of two clients reaches the API server through a proxy (`startFaultProxy`) that passes every request on and rewrites the `Date` header of every answer by the shift, as a kube-apiserver replica with a wrong clock, or a load balancer answering in its own name, would; the other client talks to the API server directly. Each case runs on a release of its own, under each lock backend, with `--lease-duration %s`: the holder runs `upgrade --wait` on the chart `internal/testenv/testdata/charts/app` with a nodeSelector that matches no node, so it keeps its lock and renews it (every third of a lease); once it waits, the challenger runs `upgrade` on the release with `--lock-timeout %s` (two leases). The lock is *taken over* when the challenger succeeds, the holder exits 4 (lock lost) or their write spans overlap in the audit log; the goal is never. The proxy serves the challenger (its server runs ahead of or behind the holder's) or the holder (its server runs behind or ahead of the challenger's).\n\n",
		lease, 2*lease)
	by := map[string]shiftCase{}
	for _, k := range cases {
		by[k.role+"/"+k.backend+"/"+k.shift.String()] = k
	}
	var header []string
	header = append(header, "shift")
	for _, role := range dateShiftRoles {
		for _, backend := range s.o.chaos.backends {
			header = append(header, fmt.Sprintf("%s shifted, %s", role, backend))
		}
	}
	var rows [][]string
	taken := map[string][]string{}
	for _, shift := range dateShifts {
		row := []string{signed(shift)}
		for _, role := range dateShiftRoles {
			for _, backend := range s.o.chaos.backends {
				k, ok := by[role+"/"+backend+"/"+shift.String()]
				switch {
				case !ok:
					row = append(row, "-")
				case k.takenOver():
					holder := fmt.Sprintf("holder exit %d", k.holderExit)
					if k.holderExit == -1 {
						holder = "holder still running"
					}
					row = append(row, fmt.Sprintf("**taken over** (challenger exit %d after %.1f s; %s; %d overlaps)", k.challengerExit, k.challengerSecs, holder, k.overlaps))
					if !slices.Contains(taken[role], signed(shift)) {
						taken[role] = append(taken[role], signed(shift))
					}
				case !k.ok():
					row = append(row, "**failed**")
				default:
					row = append(row, fmt.Sprintf("no (challenger exit %d after %.1f s)", k.challengerExit, k.challengerSecs))
				}
			}
		}
		rows = append(rows, row)
	}
	b.WriteString(table(header, rows))
	var n, twoDeployed, ovl int
	for _, k := range cases {
		if k.takenOver() {
			n++
		}
		if k.deployed > 1 {
			twoDeployed++
		}
		ovl += k.overlaps
	}
	b.WriteString("\n")
	b.WriteString(table([]string{"figure", "measured", "goal"}, [][]string{
		{"live locks taken over", fmt.Sprintf("%d of %d", n, len(cases)), "0"},
		{"overlapping holders (audit log)", fmt.Sprint(ovl), "0"},
		{"cases with two `deployed` revisions", fmt.Sprint(twoDeployed), "0"},
	}))
	b.WriteString("\n")
	if n == 0 {
		b.WriteString("No shift took a live lock over.\n")
	} else {
		for _, role := range dateShiftRoles {
			if len(taken[role]) > 0 {
				fmt.Fprintf(&b, "Taken over with the %s's `Date` shifted by %s.\n", role, strings.Join(taken[role], ", "))
			}
		}
		fmt.Fprintf(&b, "\n**Residual risk.** A lock is judged expired (`internal/lock/judge.go`) when the taker's lower bound on the API server's clock, estimated from the `Date` headers *it* receives (`internal/servertime`), passes LOCKED TILL plus 250 ms, and LOCKED TILL is the holder's own estimate of that clock plus one lease, renewed every third of a lease. Nothing else is required: the taker need not have seen the lock unchanged for a lease in its own elapsed time (client-go's leader election judges by that observed time alone). So when the `Date` headers the two clients see disagree by more than what is left of the holder's lease at that moment (at most a lease, %s; about two thirds of one, %s, when renewals are on time, less when one is late), the live lock is taken over: by a taker whose server runs ahead, or from a holder whose server runs behind (its LOCKED TILL is already past for everyone else). The holder then finds its lock gone and stops (exit 4): the takeover aborts a live operation; it is not yet a double write unless the audit spans overlap. The window is open in this build; the table above is its measured extent.\n",
			lease, (lease * 2 / 3).String())
		var pendingAfter int
		for _, k := range cases {
			if k.takenOver() && k.challengerExit == exitcode.Pending {
				pendingAfter++
			}
		}
		if pendingAfter > 0 {
			fmt.Fprintf(&b, "\nIn %d of these cases the challenger, having taken the lock, then refused the release with exit 5: the holder's revision was pending under a lock record whose times (in the holder's lagging estimate) do not cover it, so it was judged stock helm's and left pending until `--recover-legacy-after` (an hour by default), while its holder had been stopped.\n", pendingAfter)
		}
		b.WriteString("\nNot measured: a client whose server runs *behind* waits for a dead holder's lock that much longer (S4's \"no extra wait\" holds only when both clients read one truthful clock).\n")
	}
	var failed []string
	for _, k := range cases {
		if !k.ok() {
			failed = append(failed, fmt.Sprintf("- %s's `Date` %s (%s): taken over %t, overlapping spans %d: %s", k.role, signed(k.shift), k.backend, k.takenOver(), k.overlaps, strings.TrimSpace(k.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("dateshift", "--chaos-lease="+lease.String(), "--chaos-backends="+strings.Join(s.o.chaos.backends, ",")))
	return b.String()
}
