package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The contention group (issue 14 item 8): --clients clients (default 20)
// each run --upgrades no-wait upgrades (default 5) of one release one
// after another, all with --lock-timeout, once with every client on each
// lock backend and once with the backends mixed. Every upgrade must
// succeed, the history must be contiguous, and no two upgrades' writes of
// the release may interleave in the API server's audit log. The size comes
// from the bench's own --clients and --upgrades (e.g. --clients=4
// --upgrades=2 while developing).

func init() { chaosScenarios["contention-mixed"] = (*suite).chaosContentionMixed }

// contentionMixedBackends are the --lock-backend values of the mixed case,
// given to the clients in turn (auto picks lease here: every client is in
// system:masters).
var contentionMixedBackends = []string{"release", "lease", "auto"}

// contentionMixedRelease is the contended release of every case (each case
// has a namespace of its own).
const contentionMixedRelease = "contended"

// contendedOp is one operation of a contention case: the install
// (client -1) or one upgrade of one client.
type contendedOp struct {
	client, n     int
	user, backend string
	start, end    time.Time // the process's lifetime, on the machine's clock
	exit          int
	stderr        string
	writes        int       // of the release's records and Lease, from the audit log
	first, last   time.Time // its tenure: the earliest completion and the latest reception of its writes
}

func (o contendedOp) label() string {
	if o.client < 0 {
		return "install"
	}
	return fmt.Sprintf("client %d upgrade %d", o.client, o.n)
}

// contendedCase is one case: the clients' backends and what they did.
type contendedCase struct {
	name     string
	backends []string // given to the clients in turn
	ops      []contendedOp
	upgrades int // clients x upgrades

	succeeded                int     // upgrades that exited 0
	revisions                int     // stored at the end
	lost, deployed, pending  int     // historyCheck
	interleavings, overlaps  int     // of the operations' writes (see writeRuns)
	unordered                int     // pairs of writes the audit log cannot order (a figure)
	unattributed             int     // writes in no operation's lifetime
	total                    float64 // seconds from the clients' start to the last exit
	upgradeSecs, writesPerOp []float64
	note                     string
}

func (c contendedCase) ok() bool {
	return c.succeeded == c.upgrades && c.revisions == 1+c.upgrades && c.lost == 0 && c.deployed == 1 && c.pending == 0 &&
		c.interleavings == 0 && c.overlaps == 0 && c.unattributed == 0
}

// chaosContentionMixed runs the cases: one per backend of --chaos-backends
// (every client on it), then the backends mixed.
func (s *suite) chaosContentionMixed(ctx context.Context) (*chaosResult, error) {
	res := &chaosResult{}
	var cases []contendedCase
	for _, b := range append(append([]string{}, s.o.chaos.backends...), "mixed") {
		backends := []string{b}
		if b == "mixed" {
			backends = contentionMixedBackends
		}
		c, err := s.contendOnce(ctx, b, backends)
		if err != nil {
			return res, fmt.Errorf("contention %s: %w", b, err)
		}
		cases = append(cases, c)
		verdict := res.tally(c.ok())
		res.line("contention-mixed %-7s %-9s succeeded=%d/%d revisions=%d lost=%d deployed=%d pending=%d interleavings=%d overlaps=%d unattributed=%d unordered=%d writes/upgrade=%.0f total=%.1fs %s",
			c.name, verdict, c.succeeded, c.upgrades, c.revisions, c.lost, c.deployed, c.pending, c.interleavings, c.overlaps, c.unattributed, c.unordered, median(c.writesPerOp), c.total, c.note)
	}
	res.markdown = s.contentionMixedReport(cases)
	return res, nil
}

// contendOnce installs the release, then lets the clients upgrade it all
// at once, and checks the history and the audit log.
func (s *suite) contendOnce(ctx context.Context, name string, backends []string) (contendedCase, error) {
	c := contendedCase{name: name, backends: backends, upgrades: s.o.clients * s.o.upgrades}
	ns, err := s.namespace(ctx, "chaos-contention-"+name)
	if err != nil {
		return c, err
	}
	rel := contentionMixedRelease
	args := func(verb, backend string, extra ...string) []string {
		a := []string{verb, rel, s.o.smallChart, "--namespace", ns, "--lock-backend", backend}
		return append(a, extra...)
	}
	install := contendedOp{client: -1, user: "chaos-contention-" + name + "-install", backend: backends[len(backends)-1]}
	p, err := s.runAs(ctx, install.user, nil, args("install", install.backend)...)
	if err != nil {
		return c, err
	}
	if err := p.err(); err != nil {
		return c, err
	}
	install.start, install.end, install.exit = p.start, p.end, p.exit
	var mu sync.Mutex
	var wg sync.WaitGroup
	ops := []contendedOp{install}
	start := time.Now()
	for cl := range s.o.clients {
		backend := backends[cl%len(backends)]
		user := fmt.Sprintf("chaos-contention-%s-c%02d", name, cl)
		wg.Go(func() {
			for n := range s.o.upgrades {
				op := contendedOp{client: cl, n: n, user: user, backend: backend, exit: -1}
				// --history-max 0: every revision is kept, so a lost one shows.
				p, err := s.runAs(ctx, user, nil, args("upgrade", backend, "--history-max", "0", "--lock-timeout", "15m", "--set", fmt.Sprintf("message=c%d-u%d", cl, n))...)
				if err != nil {
					op.stderr = err.Error()
				} else {
					op.start, op.end, op.exit, op.stderr = p.start, p.end, p.exit, tail(p.stderr.String(), 300)
				}
				mu.Lock()
				ops = append(ops, op)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	c.total = time.Since(start).Seconds()
	c.ops = ops
	for _, op := range ops[1:] {
		if op.exit == 0 {
			c.succeeded++
			c.upgradeSecs = append(c.upgradeSecs, op.end.Sub(op.start).Seconds())
		} else if c.note == "" {
			c.note = fmt.Sprintf("%s (%s) exit %d: %s", op.label(), op.backend, op.exit, op.stderr)
		}
	}
	if ctx.Err() != nil {
		return c, ctx.Err()
	}
	h, err := s.history(ctx, ns, rel)
	if err != nil {
		return c, err
	}
	c.revisions = len(h)
	c.lost, c.deployed, c.pending = historyCheck(h)
	evs, err := testenv.ReadAuditWrites(s.o.chaos.auditLog, ns)
	if err != nil {
		return c, err
	}
	var writes []testenv.AuditEvent
	for _, e := range evs {
		if holderWrite(e, rel) {
			writes = append(writes, e)
		}
	}
	var first string
	c.interleavings, c.overlaps, c.unordered, c.unattributed, first = writeRuns(c.ops, writes)
	if first != "" {
		c.note = strings.TrimSpace(c.note + " first interleaving: " + first)
	}
	for _, op := range c.ops[1:] {
		if op.exit == 0 {
			c.writesPerOp = append(c.writesPerOp, float64(op.writes))
		}
	}
	return c, nil
}

// holderWrite reports whether e writes rel's records or its Lease: what
// only a holder writes (the beat, where waiters queue, is left out; see
// holderSpans).
func holderWrite(e testenv.AuditEvent, rel string) bool {
	name := e.ObjectRef.Name
	return e.ObjectRef.Resource == "leases" && name == lock.LeaseName(rel) ||
		e.ObjectRef.Resource == "secrets" && strings.HasPrefix(name, "sh.helm.release.v1."+rel+".v")
}

// writeRuns measures mutual exclusion from the audit log. Each write goes
// to the operation of its user whose process lifetime contains the write's
// completion (a user's operations run one after another, so at most one
// does). The API server commits a write somewhere between the time it
// received it (requestReceivedTimestamp) and the time it completed its
// answer (stageTimestamp, which a loaded server can stamp well after the
// commit, after the next holder has already seen it): so only what those
// bounds prove counts. An operation surely held the release from its
// earliest completion to its latest reception (its tenure; every operation
// writes at least five times); then
//
//   - interleavings: writes of one operation that surely committed inside
//     another's tenure (received after that tenure began, completed before
//     it ended): an A, B, A in the order of commits;
//   - overlapping: pairs of operations whose tenures overlap;
//   - unordered: pairs of writes of different operations whose bounds
//     overlap, that the log cannot order (a figure, not a fault);
//   - unattributed: writes in no operation's lifetime (goal 0: such a write
//     escapes every measure).
//
// It sets each operation's writes, first and last (its tenure), and first
// describes the first interleaving.
func writeRuns(ops []contendedOp, writes []testenv.AuditEvent) (interleavings, overlapping, unordered, unattributed int, first string) {
	byUser := map[string][]int{}
	for i, op := range ops {
		byUser[op.user] = append(byUser[op.user], i)
	}
	type owned struct {
		recv, done time.Time
		op         int
		object     string
	}
	var seq []owned
	for _, e := range writes {
		owner := -1
		for _, i := range byUser[e.ImpersonatedUser.Username] {
			if !e.StageTimestamp.Before(ops[i].start) && !e.StageTimestamp.After(ops[i].end) {
				owner = i
				break
			}
		}
		if owner < 0 {
			unattributed++
			continue
		}
		op := &ops[owner]
		if op.writes == 0 || e.StageTimestamp.Before(op.first) {
			op.first = e.StageTimestamp
		}
		if op.writes == 0 || e.RequestReceived.After(op.last) {
			op.last = e.RequestReceived
		}
		op.writes++
		seq = append(seq, owned{e.RequestReceived, e.StageTimestamp, owner, e.Verb + " " + e.ObjectRef.Resource + "/" + e.ObjectRef.Name})
	}
	sort.SliceStable(seq, func(i, j int) bool { return seq[i].recv.Before(seq[j].recv) })
	var spans []span
	for i, op := range ops {
		if op.writes == 0 || !op.first.Before(op.last) {
			continue
		}
		spans = append(spans, span{user: op.label(), first: op.first, last: op.last, writes: op.writes})
		for _, w := range seq {
			if w.op != i && op.first.Before(w.recv) && w.done.Before(op.last) {
				interleavings++
				if first == "" {
					first = fmt.Sprintf("%s wrote %s (received %s, done %s) while %s held the release (from %s to %s)",
						ops[w.op].label(), w.object, w.recv.Format(time.StampMicro), w.done.Format(time.StampMicro), op.label(), op.first.Format(time.StampMicro), op.last.Format(time.StampMicro))
				}
			}
		}
	}
	for i, w := range seq {
		for _, x := range seq[i+1:] {
			if !x.recv.Before(w.done) {
				break // sorted by reception: no later write overlaps w
			}
			if x.op != w.op {
				unordered++
			}
		}
	}
	return interleavings, overlaps(spans), unordered, unattributed, first
}

// repoPath is path relative to the working directory (the repository),
// as the document shows it.
func repoPath(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if r, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(r, "..") {
		return filepath.ToSlash(r)
	}
	return path
}

// contentionMixedReport is the group's section.
func (s *suite) contentionMixedReport(cases []contendedCase) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("### Contention, both backends and mixed\n\n")
	p("%d clients, each its own impersonated user, start at once; each runs %d no-wait upgrades of one release (the chart `%s`, a distinct `--set message=` each) one after another, with `--lock-timeout 15m` and `--history-max 0` (every revision kept), default flags otherwise, after one install. ", s.o.clients, s.o.upgrades, repoPath(s.o.smallChart))
	p("Cases: every client with `--lock-backend=release`, every client with `lease`, and mixed (the clients take `%s` in turn; `auto` picks `lease` here, every client being in `system:masters`). ", strings.Join(contentionMixedBackends, "`, `"))
	p("Checks: every upgrade exits 0; the history has 1 + %d revisions with no gap, exactly one `deployed` and none pending; and the upgrades held the release one at a time, by the API server's audit log.\n\n", s.o.clients*s.o.upgrades)
	p("Each upgrade (not each client) is one holder. A write of the release's records (`sh.helm.release.v1.%s.v*`) or its Lease (the beat, where waiters queue, is left out) belongs to the operation of its user whose process lifetime contains the write's completion (the audit log and the process start and exit are read on the same machine clock; a client's upgrades run one after another, so at most one operation can own a write). ", contentionMixedRelease)
	p("The API server commits a write somewhere between the time it received it (`requestReceivedTimestamp`) and the time it completed its answer (`stageTimestamp`); a loaded server can complete the answer well after the commit, after the next holder has already seen the release and written, so the completion time alone does not order writes, and only what both bounds prove counts. An operation surely held the release from the earliest completion to the latest reception of its writes (its **tenure**; an upgrade writes 5 times, 7 with the Lease). ")
	p("**Interleavings** counts writes of one operation that surely committed inside another's tenure (received after it began, completed before it ended): an A, B, A in the order of commits. **Overlapping holders** counts pairs of operations whose tenures overlap (the kill matrix's measure, taken per operation instead of per client). A write in no operation's lifetime would escape both, so **unattributed writes** must be 0 as well. **Unordered pairs** (writes of two operations whose bounds overlap, which the log cannot order: a releasing holder's last answer still in flight when the next holder's first write arrives) and the total time (the clients' start to the last exit) are figures, not goals.\n\n")
	var rows [][]string
	for _, c := range cases {
		rows = append(rows, []string{
			c.name,
			fmt.Sprintf("%d of %d", c.succeeded, c.upgrades),
			fmt.Sprintf("%d of %d, lost %d, deployed %d, pending %d", c.revisions, 1+c.upgrades, c.lost, c.deployed, c.pending),
			strconv.Itoa(c.interleavings),
			strconv.Itoa(c.overlaps),
			strconv.Itoa(c.unattributed),
			strconv.Itoa(c.unordered),
			fmt.Sprintf("%.0f", median(c.writesPerOp)),
			secs(c.total),
			fmt.Sprintf("%s / %s", secs(median(c.upgradeSecs)), secs(maxOf(c.upgradeSecs))),
			verdict(c.ok()),
		})
	}
	n := s.o.clients * s.o.upgrades
	rows = append(rows, []string{"goal", fmt.Sprintf("%d of %d", n, n), fmt.Sprintf("%d, lost 0, deployed 1, pending 0", 1+n), "0", "0", "0", "figure", "-", "figure", "figure", ""})
	b.WriteString(table([]string{"case", "upgrades succeeded", "revisions", "interleavings", "overlapping holders", "unattributed writes", "unordered pairs", "writes per upgrade (median)", "total", "one upgrade, waiting included: median / max", "goals"}, rows))
	var failed []string
	for _, c := range cases {
		if !c.ok() {
			failed = append(failed, fmt.Sprintf("- %s: %s", c.name, strings.TrimSpace(c.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("contention-mixed", fmt.Sprintf("--clients=%d", s.o.clients), fmt.Sprintf("--upgrades=%d", s.o.upgrades)))
	return b.String()
}
