package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The faults group (issue 14 item 5): slow and failing servers. A client
// upgrades through a fault proxy (startFaultProxy) that delays its writes,
// answers 429 and 5xx, or resets connections; then a clean upgrade runs
// directly and the case checks that the faulty client wrote nothing after
// its deadline, left nothing pending, and said clearly what failed.

func init() { chaosScenarios["faults"] = (*suite).chaosFaults }

// faultsSeed seeds every random choice of the group (the lease of each
// case, which writes are held and for how long, which requests fail): a
// rerun draws the same. The timing of the clients still varies.
var faultsSeed int64 = 14

// faultModes are the group's cases, run under each backend:
//   - delay: every faultsDelayEvery-th write is held 1..faultsMaxDelay,
//     then forwarded unless the client gave up meanwhile;
//   - delay-late: the same, but a write the client gave up on is forwarded
//     anyway when its hold ends, as a slow server commits it late;
//   - errors: faultsErrorShare of the requests get 429 (with Retry-After),
//     500 or 503 from the proxy instead of the API server's answer;
//   - resets: faultsResetShare of the requests have their connection
//     reset; half of the writes among them after the API server answered
//     (the write committed, its answer lost);
//   - reset-supersede: once the client created its pending revision, the
//     first faultsSupersedeResets requests for the revision before it
//     (helm's rewrite of it as superseded) have their connection reset: a
//     deterministic form of resets that hits the write helm ignores the
//     failure of, and that the fence sends again (a failure lasting longer
//     than its retries is a residual risk, docs/protocol.md).
var faultModes = []string{"delay", "delay-late", "errors", "resets", "reset-supersede"}

const (
	// faultsSupersedeResets is how many requests reset-supersede resets.
	faultsSupersedeResets = 3
	faultsDelayEvery      = 3
	faultsMaxDelay        = 30 * time.Second
	faultsErrorShare      = 0.2
	faultsResetShare      = 0.1
	// faultsLeaseMin and faultsLeaseMax bound the faulty client's
	// --lease-duration, drawn per case.
	faultsLeaseMin = 3
	faultsLeaseMax = 6
	// faultsSteadyLease is the --lease-duration of the clients that run
	// directly (the install before, the clean upgrade after): on a loaded
	// machine a 3 s lease can be lost to a slow renewal, which is not what
	// this group measures.
	faultsSteadyLease = 10 * time.Second
	// faultsClientLimit ends a faulty client that is still running (exit
	// -1, counted as an undocumented exit code).
	faultsClientLimit = 5 * time.Minute
)

// faultCase is one case of the group.
type faultCase struct {
	mode, backend, rel string
	lease              time.Duration
	injected           string // what the proxy did, by kind
	exit               int    // the faulty client's
	documented         bool   // exit is one an upgrade documents (docs/exit-codes.md)
	wrongCode          bool   // it said it lost its lock but did not exit with exitcode.LockLost
	unclear            int    // 1 when it failed with a message that names not both the release and the namespace
	lateWrites         int    // its successful writes of the release's records and Lease after the next client's first (audit log)
	lateOther          int    // writes the proxy forwarded after it gave up that the API server accepted, after the next client's first write (chart objects included)
	nextExit           int    // the clean upgrade's
	lost, deployed     int
	pending            int // revisions left pending once every held write has landed
	overlaps           int
	note               string
}

func (c faultCase) ok() bool {
	return c.documented && !c.wrongCode && c.unclear == 0 && c.lateWrites == 0 && c.nextExit == 0 &&
		c.lost == 0 && c.deployed == 1 && c.pending == 0 && c.overlaps == 0
}

// upgradeExits are the exit codes docs/exit-codes.md gives an upgrade.
var upgradeExits = []int{exitcode.OK, exitcode.Failure, exitcode.Locked, exitcode.LockLost, exitcode.Pending, exitcode.MaxHold}

// chaosFaults runs every mode under each backend.
func (s *suite) chaosFaults(ctx context.Context) (*chaosResult, error) {
	ns, err := s.namespace(ctx, "chaos-faults")
	if err != nil {
		return nil, err
	}
	fmt.Printf("faults: seed %d (faultsSeed in hack/benchsuite/chaos_faults.go)\n", faultsSeed)
	rnd := rand.New(rand.NewSource(faultsSeed))
	res := &chaosResult{}
	var cases []faultCase
	for _, backend := range s.o.chaos.backends {
		for _, mode := range faultModes {
			// Each case draws from its own source, so leaving a backend
			// out does not change the others' draws.
			seed := rnd.Int63()
			c, err := s.faultOnce(ctx, ns, mode, backend, seed)
			if err != nil {
				return res, fmt.Errorf("faults %s (%s): %w", mode, backend, err)
			}
			cases = append(cases, c)
			verdict := res.tally(c.ok())
			res.line("faults %-15s %-7s %-9s lease=%s exit=%d lock-lost-not-4=%t late-writes=%d late-other=%d left-pending=%d unclear=%d overlaps=%d next-exit=%d lost=%d deployed=%d injected=[%s] %s",
				mode, backend, verdict, c.lease, c.exit, c.wrongCode, c.lateWrites, c.lateOther, c.pending, c.unclear, c.overlaps, c.nextExit, c.lost, c.deployed, c.injected, c.note)
		}
	}
	rows, goals := faultTables(cases)
	fmt.Println(rows)
	fmt.Println(goals)
	res.markdown = s.faultsReport(cases, rows, goals)
	return res, nil
}

// faultOnce runs one case on a release of its own: install it directly,
// upgrade it through the proxy, then upgrade it directly again.
func (s *suite) faultOnce(ctx context.Context, ns, mode, backend string, seed int64) (faultCase, error) {
	rnd := rand.New(rand.NewSource(seed))
	rel := fmt.Sprintf("faults-%s-%s", mode, shortBackend(backend))
	c := faultCase{
		mode: mode, backend: backend, rel: rel, exit: -1, nextExit: -1,
		lease: time.Duration(faultsLeaseMin+rnd.Intn(faultsLeaseMax-faultsLeaseMin+1)) * time.Second,
	}
	logFile := filepath.Join(s.dir, "chaos-"+rel+".log")
	if err := s.chaosMust(ctx, "chaos-setup-"+rel, withLease(s.opArgs("install", rel, ns, backend, true), faultsSteadyLease)); err != nil {
		c.note = "setup failed: " + tail(err.Error(), 300)
		return c, nil
	}
	inj := &faultInjector{mode: mode, rnd: rnd}
	px, err := s.startFaultProxy(inj.handle)
	if err != nil {
		return c, err
	}
	defer px.Close()
	faulty := "chaos-faulty-" + rel
	kc, err := px.kubeconfig(s, faulty)
	if err != nil {
		return c, err
	}
	args := withLease(s.opArgs("upgrade", rel, ns, backend, false), c.lease)
	fctx, cancel := context.WithTimeout(ctx, faultsClientLimit)
	defer cancel()
	p, err := s.startWith(fctx, kc, chaosEnv("", logFile), s.o.bin, args...)
	if err != nil {
		return c, err
	}
	p.wait()
	c.exit = p.exit
	c.documented = slices.Contains(upgradeExits, p.exit)
	if p.exit != 0 {
		e := errorLines(p.stderr.String())
		if !strings.Contains(e, rel) || !strings.Contains(e, ns) {
			c.unclear = 1
		}
		// docs/exit-codes.md: 4 when this process lost its lock and
		// stopped; scripts retry on it.
		c.wrongCode = strings.Contains(e, lock.ErrLost.Error()) && p.exit != exitcode.LockLost
		c.note = "faulty: " + tail(e, 300)
	}
	// The clean upgrade, at once: the proxy may still hold writes of the
	// faulty client, and (delay-late) forward them while it runs.
	next := "chaos-next-" + rel
	np, err := s.runAs(ctx, next, chaosEnv("", logFile), withLease(s.opArgs("upgrade", rel, ns, backend, true), faultsSteadyLease)...)
	if err != nil {
		return c, err
	}
	c.nextExit = np.exit
	if np.exit != 0 {
		c.note += " next: " + tail(errorLines(np.stderr.String()), 300)
	}
	// Every held write has landed or been dropped before the checks.
	inj.wg.Wait()
	if c.injected = inj.summary(); c.injected == "" {
		c.note += " (no fault injected: the client ended before one)"
	}
	rc, err := s.checkRelease(ctx, ns, rel)
	if err != nil {
		return c, err
	}
	c.lost, c.deployed, c.pending, c.overlaps = rc.lost, rc.deployed, rc.pending, rc.overlaps
	spans := rc.spans
	var nextFirst time.Time
	for _, sp := range spans {
		if sp.user == next {
			nextFirst = sp.first
		}
	}
	if nextFirst.IsZero() {
		c.note += " (the next client wrote nothing)"
		return c, nil
	}
	if c.lateWrites, err = s.lateWrites(ns, rel, faulty, nextFirst); err != nil {
		return c, err
	}
	for _, f := range inj.lateForwards() {
		if f.code < 300 && f.done.After(nextFirst) {
			c.lateOther++
			c.note += fmt.Sprintf(" late %s %s: %d", f.method, f.path, f.code)
		}
	}
	return c, nil
}

// withLease replaces the --lease-duration of args.
func withLease(args []string, lease time.Duration) []string {
	out := slices.Clone(args)
	if i := slices.Index(out, "--lease-duration"); i >= 0 && i+1 < len(out) {
		out[i+1] = lease.String()
	}
	return out
}

// errorLine is the first line of msg that starts with "Error:", else its
// end.
func errorLine(msg string) string {
	for _, l := range strings.Split(msg, "\n") {
		if strings.HasPrefix(l, "Error:") {
			return tail(l, 300)
		}
	}
	return tail(msg, 300)
}

// errorLines are the lines of msg that start with "Error:" (the error, not
// the warnings before it), else all of msg.
func errorLines(msg string) string {
	var out []string
	inError := false
	for _, l := range strings.Split(msg, "\n") {
		// An error's own further lines (the guard's note under helm's
		// error) go with it.
		inError = strings.HasPrefix(l, "Error:") || (inError && strings.HasPrefix(l, "helm-autorecover: "))
		if inError {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return msg
	}
	return strings.Join(out, "\n")
}

// lateWrites counts user's successful writes of rel's records and Lease
// (those holderSpans reads) that the API server committed after after.
func (s *suite) lateWrites(ns, rel, user string, after time.Time) (int, error) {
	evs, err := testenv.ReadAuditWrites(s.o.chaos.auditLog, ns)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range evs {
		name := e.ObjectRef.Name
		ok := e.ObjectRef.Resource == "leases" && name == lock.LeaseName(rel) ||
			e.ObjectRef.Resource == "secrets" && strings.HasPrefix(name, "sh.helm.release.v1."+rel+".v")
		if ok && e.ImpersonatedUser.Username == user && e.StageTimestamp.After(after) {
			n++
		}
	}
	return n, nil
}

// faultInjector is the fault proxy's handler of one case.
type faultInjector struct {
	mode string
	wg   sync.WaitGroup // held writes

	mu       sync.Mutex
	rnd      *rand.Rand
	writes   int
	counts   map[string]int // what was done, by kind
	forwards []lateForward
	previous string // reset-supersede: the record whose requests are reset
}

// lateForward is a write the proxy forwarded after its client gave up.
type lateForward struct {
	method, path string
	code         int
	done         time.Time
}

func isWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// draw returns a random number in [0,1) and counts the request (and, for
// a write, returns its rank).
func (f *faultInjector) draw(write bool) (float64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if write {
		f.writes++
	}
	return f.rnd.Float64(), f.writes
}

func (f *faultInjector) count(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.counts[kind]++
}

func (f *faultInjector) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for _, k := range sortedKeys(f.counts) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, f.counts[k]))
	}
	return strings.Join(parts, " ")
}

func (f *faultInjector) lateForwards() []lateForward {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.forwards)
}

// handle serves one request of the faulty client.
func (f *faultInjector) handle(w http.ResponseWriter, r *http.Request, forward http.Handler) {
	write := isWrite(r)
	p, n := f.draw(write)
	switch f.mode {
	case "delay", "delay-late":
		if write && n%faultsDelayEvery == 0 {
			f.wg.Add(1)
			defer f.wg.Done()
			f.hold(w, r, forward)
			return
		}
	case "errors":
		if p < faultsErrorShare {
			f.fail(w, p)
			return
		}
	case "reset-supersede":
		if f.supersede(r) && f.counts["reset"] < faultsSupersedeResets {
			f.count("reset")
			reset(w)
			return
		}
	case "resets":
		if p < faultsResetShare {
			if write && p < faultsResetShare/2 {
				// The write reaches the API server; its answer is lost.
				forward.ServeHTTP(httptest.NewRecorder(), r)
				f.count("reset-after-write")
			} else {
				f.count("reset")
			}
			reset(w)
			return
		}
	}
	forward.ServeHTTP(w, r)
}

// recordName matches the name of a release record.
var recordName = regexp.MustCompile(`sh\.helm\.release\.v1\.([a-z0-9-]+)\.v([0-9]+)`)

// supersede reports whether r is for the record of the revision before the
// one the client created (after it created one: helm's Secrets driver
// POSTs the pending revision's record, sh.helm.release.v1.REL.vN).
func (f *faultInjector) supersede(r *http.Request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/secrets") {
		// The record's name is in the body as it is, JSON or protobuf.
		body, err := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if m := recordName.FindSubmatch(body); err == nil && m != nil {
			if v, err := strconv.Atoi(string(m[2])); err == nil && v > 1 {
				f.previous = fmt.Sprintf("sh.helm.release.v1.%s.v%d", m[1], v-1)
			}
		}
		return false
	}
	return f.previous != "" && strings.HasSuffix(r.URL.Path, "/secrets/"+f.previous)
}

// hold keeps a write for 1..faultsMaxDelay, then forwards it. When its
// client gave up meanwhile, the write is dropped (delay) or forwarded
// anyway, its answer kept for the report (delay-late).
func (f *faultInjector) hold(w http.ResponseWriter, r *http.Request, forward http.Handler) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.count("unreadable")
		return
	}
	f.mu.Lock()
	d := time.Second + time.Duration(f.rnd.Int63n(int64(faultsMaxDelay-time.Second)+1))
	f.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.count("held")
		forward.ServeHTTP(w, r)
		return
	case <-r.Context().Done():
	}
	if f.mode == "delay" {
		f.count("held-dropped")
		return
	}
	<-t.C
	late := r.Clone(context.WithoutCancel(r.Context()))
	late.Body = io.NopCloser(bytes.NewReader(body))
	late.ContentLength = int64(len(body))
	rec := httptest.NewRecorder()
	forward.ServeHTTP(rec, late)
	f.count("held-late")
	f.mu.Lock()
	f.forwards = append(f.forwards, lateForward{method: r.Method, path: r.URL.Path, code: rec.Code, done: time.Now()})
	f.mu.Unlock()
}

// fail answers in place of the API server, as a throttled or failing one
// does: 429 with Retry-After, 500 or 503 (p picks which).
func (f *faultInjector) fail(w http.ResponseWriter, p float64) {
	code, reason := http.StatusTooManyRequests, "TooManyRequests"
	switch {
	case p < faultsErrorShare/3:
		w.Header().Set("Retry-After", "1")
	case p < 2*faultsErrorShare/3:
		code, reason = http.StatusInternalServerError, "InternalError"
	default:
		code, reason = http.StatusServiceUnavailable, "ServiceUnavailable"
	}
	f.count(strconv.Itoa(code))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
		"message": fmt.Sprintf("injected by the fault proxy: %d %s", code, http.StatusText(code)),
	})
}

// reset closes the client's connection with a TCP reset.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// faultTables are the group's per-case table and its goals.
func faultTables(cases []faultCase) (string, string) {
	var rows [][]string
	var late, lateOther, pending, unclear, overl, undocumented, wrongCode, nextFailed int
	for _, c := range cases {
		verdict := "ok"
		if !c.ok() {
			verdict = "**failed**"
		}
		rows = append(rows, []string{
			c.mode, c.backend, c.lease.String(), c.injected, strconv.Itoa(c.exit),
			strconv.Itoa(c.lateWrites), strconv.Itoa(c.lateOther), strconv.Itoa(c.pending), strconv.Itoa(c.unclear),
			strconv.Itoa(c.overlaps), strconv.Itoa(c.nextExit), verdict,
		})
		late += c.lateWrites
		lateOther += c.lateOther
		pending += c.pending
		unclear += c.unclear
		overl += c.overlaps
		if !c.documented {
			undocumented++
		}
		if c.wrongCode {
			wrongCode++
		}
		if c.nextExit != 0 || c.lost != 0 || c.deployed != 1 {
			nextFailed++
		}
	}
	perCase := table([]string{"case", "backend", "lease", "faults injected", "faulty exit", "late writes", "late forwards accepted", "left pending", "unclear errors", "overlaps", "clean upgrade exit", "verdict"}, rows)
	goals := table([]string{"figure", "measured", "goal"}, [][]string{
		{"late writes of records and Lease (audit log)", strconv.Itoa(late), "0"},
		{"revisions left pending", strconv.Itoa(pending), "0"},
		{"unclear errors", strconv.Itoa(unclear), "0"},
		{"overlapping holders (audit log)", strconv.Itoa(overl), "0"},
		{"undocumented exit codes", strconv.Itoa(undocumented), "0"},
		{"lock lost, exit code not 4", strconv.Itoa(wrongCode), "0"},
		{"clean upgrades failed or history wrong", strconv.Itoa(nextFailed), "0"},
		{"held writes the API server accepted after the takeover (any object)", strconv.Itoa(lateOther), "reported"},
	})
	return perCase, goals
}

// faultsReport is the group's section.
func (s *suite) faultsReport(cases []faultCase, perCase, goals string) string {
	var b strings.Builder
	b.WriteString("### Slow and failing servers\n\n")
	fmt.Fprintf(&b, "Each case upgrades a release through a fault proxy in front of the API server, as its own impersonated user, with a `--lease-duration` of %d-%d s drawn per case (seed %d, `faultsSeed`), under each lock backend. "+
		"`delay` holds every %d%s write (POST, PUT, PATCH, DELETE) for a random 1-%s and drops it if its client gave up meanwhile; "+
		"`delay-late` forwards it anyway, as a slow server commits a write late (the write still carries the API server `timeout` the fence gave it, counted from its arrival); "+
		"`errors` answers %.0f%% of the requests with 429 (with `Retry-After: 1`), 500 or 503; "+
		"`resets` resets the connection of %.0f%% of the requests, half of the writes among them after the API server answered (committed, answer lost); "+
		"`reset-supersede` resets, once the client created its pending revision, every request for the revision before it (helm's rewrite of it as `superseded`, whose failure helm only logs, and the fence's read before it). "+
		"Then a clean upgrade runs at once, directly, with `--lock-timeout 2m`, while held writes may still land; once the last has, the case checks: "+
		"the clean upgrade succeeded, the history has no gap, exactly one `deployed` revision and nothing pending; no two clients' write spans overlap in the audit log; "+
		"the faulty client exited with a code docs/exit-codes.md gives an upgrade (%s), 4 when its message says it lost its lock, and, if it failed, its `Error:` lines name the release and the namespace (else an unclear error; warnings before them do not count); "+
		"and no write of the release's records or Lease by the faulty client committed after the clean client's first write (a late write). "+
		"Late forwards accepted counts the held writes of any object (chart objects too) the API server accepted after that first write, as the proxy saw them.\n\n",
		faultsLeaseMin, faultsLeaseMax, faultsSeed, faultsDelayEvery, ordinal(faultsDelayEvery), faultsMaxDelay, 100*faultsErrorShare, 100*faultsResetShare, intsList(upgradeExits))
	b.WriteString(perCase)
	b.WriteString("\n")
	b.WriteString(goals)
	var failed []string
	for _, c := range cases {
		if !c.ok() {
			failed = append(failed, fmt.Sprintf("- %s (%s): exit %d%s, late writes %d, left pending %d, unclear %d, overlaps %d, clean upgrade exit %d, %d deployed, %d lost: %s",
				c.mode, c.backend, c.exit, map[bool]string{true: " (lock lost: want 4)"}[c.wrongCode], c.lateWrites, c.pending, c.unclear, c.overlaps, c.nextExit, c.deployed, c.lost, strings.TrimSpace(c.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	var flags []string
	if !slices.Equal(s.o.chaos.backends, chaosDefaults().backends) {
		flags = append(flags, "--chaos-backends="+strings.Join(s.o.chaos.backends, ","))
	}
	b.WriteString("\n" + s.chaosFooter("faults", flags...))
	return b.String()
}

// ordinal is the English suffix of n (1st, 2nd, 3rd, 4th...).
func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return "th"
	case n%10 == 1:
		return "st"
	case n%10 == 2:
		return "nd"
	case n%10 == 3:
		return "rd"
	}
	return "th"
}

// intsList joins ns with commas.
func intsList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
