package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestEmbedMixedClients: the embedder (examples/embed, pkg/autorecover's
// Client.Run) and the helm-autorecover CLI share one protocol, in both
// directions and with each lock backend (both given the same
// --lock-backend):
//
//   - a live holder of either kind refuses the other (exit 3), which leaves
//     the holder's pending revision untouched (same resourceVersion, same
//     status) and writes nothing;
//   - a holder of either kind SIGKILLed after its pending revision appears
//     is recovered by the other once its lease expired: the abandoned
//     revision reads failed naming its session, the other's own upgrade
//     succeeds, and the release never has two deployed revisions (a watch
//     on its Secrets sees every change);
//   - both upgrading the release at once never overlap.
//
// In every scenario the API server's audit log shows no write of one kind
// of client between the first and the last write of an operation of the
// other kind, and no write by a refused client. The CLI impersonates a user
// with --kube-as-user; the embed program reads a kubeconfig that
// impersonates another, as helm does.
func TestEmbedMixedClients(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	auditLog := testenv.AuditLog()
	if _, err := os.Stat(auditLog); err != nil {
		t.Fatalf("this test reads the local cluster's audit log: %v", err)
	}
	dir := t.TempDir()
	embed := buildEmbed(t, dir)

	for _, b := range []struct {
		backend string
		read    lockReader
	}{{"lease", leaseLock}, {"release", recordLock}} {
		t.Run(b.backend, func(t *testing.T) {
			kubeconfig := impersonatingKubeconfig(t, env, dir, "embed-"+b.backend)
			mk := func(t *testing.T) *mixedRun {
				return &mixedRun{
					t: t, env: env, ha: ha, embed: embed, kubeconfig: kubeconfig,
					chart: env.Chart("app"), ns: env.Namespace(t), rel: "embed-mixed",
					backend: b.backend, read: b.read, auditLog: auditLog,
				}
			}
			t.Run("embed-holds-cli-refused", func(t *testing.T) { heldRefuses(mk(t), kindEmbed, kindCLI) })
			t.Run("cli-holds-embed-refused", func(t *testing.T) { heldRefuses(mk(t), kindCLI, kindEmbed) })
			t.Run("embed-killed-cli-recovers", func(t *testing.T) { killedRecovered(mk(t), kindEmbed, kindCLI) })
			t.Run("cli-killed-embed-recovers", func(t *testing.T) { killedRecovered(mk(t), kindCLI, kindEmbed) })
			t.Run("concurrent-upgrades", func(t *testing.T) { concurrentUpgrades(mk(t)) })
		})
	}
}

// buildEmbed builds examples/embed into dir from this checkout.
func buildEmbed(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "embed")
	cmd := exec.Command("go", "build", "-o", bin, "./examples/embed")
	cmd.Dir = testenv.RepoRoot()
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/embed: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// impersonatingKubeconfig is testenv.ImpersonatingKubeconfig of the
// cluster's admin kubeconfig, failing t on an error.
func impersonatingKubeconfig(t *testing.T, env *testenv.Env, dir, user string) string {
	t.Helper()
	path, err := testenv.ImpersonatingKubeconfig(env.Kubeconfig, dir, user)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// clientKind is one of the two clients of the protocol.
type clientKind string

const (
	kindEmbed clientKind = "embed"
	kindCLI   clientKind = "cli"
)

func (k clientKind) other() clientKind {
	if k == kindEmbed {
		return kindCLI
	}
	return kindEmbed
}

// mixedOp is one operation of a client, by local wall clock (the API
// server runs on this machine: the audit log's timestamps are on the same
// clock). Refused operations must not write; the others' write spans must
// not overlap another kind's.
type mixedOp struct {
	kind       clientKind
	what       string
	start, end time.Time
	refused    bool
}

// mixedRun is one scenario: a release in its own namespace, upgraded by
// both kinds of client with one backend.
type mixedRun struct {
	t                     *testing.T
	env                   *testenv.Env
	ha, embed, kubeconfig string
	chart, ns, rel        string
	backend               string
	read                  lockReader
	auditLog              string

	mu  sync.Mutex
	ops []mixedOp
}

// user is the impersonated user name of kind's requests.
func (m *mixedRun) user(k clientKind) string { return string(k) + "-" + m.backend }

// command is the upgrade-or-install of the release by kind with extra flags
// (flags the embed program and the CLI spell alike).
func (m *mixedRun) command(k clientKind, extra ...string) (string, []string) {
	if k == kindEmbed {
		return m.embed, append([]string{
			"--release", m.rel, "--namespace", m.ns, "--chart", m.chart,
			"--lock-backend", m.backend, "--kubeconfig", m.kubeconfig,
		}, extra...)
	}
	return m.ha, append([]string{
		"upgrade", "--install", m.rel, m.chart, "-n", m.ns,
		"--lock-backend", m.backend, "--kube-as-user", m.user(k), "--kube-as-group", "system:masters",
	}, extra...)
}

func (m *mixedRun) record(o mixedOp) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops = append(m.ops, o)
}

// run runs kind's upgrade to completion and records it when it succeeded or
// was refused (exit 3).
func (m *mixedRun) run(k clientKind, what string, extra ...string) testenv.Result {
	m.t.Helper()
	bin, a := m.command(k, extra...)
	start := time.Now()
	res := m.env.Run(m.t, bin, a...)
	end := time.Now()
	switch res.ExitCode {
	case 0:
		m.record(mixedOp{kind: k, what: what, start: start, end: end})
	case exitcode.Locked:
		m.record(mixedOp{kind: k, what: what, start: start, end: end, refused: true})
	}
	return res
}

// mustRun is run, failing the test unless kind's upgrade exits 0.
func (m *mixedRun) mustRun(k clientKind, what string, extra ...string) testenv.Result {
	m.t.Helper()
	res := m.run(k, what, extra...)
	if res.ExitCode != 0 {
		m.t.Fatalf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", k, what, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res
}

// running is an operation started in the background.
type running struct {
	kind  clientKind
	what  string
	proc  *testenv.Proc
	start time.Time
}

func (m *mixedRun) start(k clientKind, what string, extra ...string) *running {
	m.t.Helper()
	bin, a := m.command(k, extra...)
	start := time.Now()
	return &running{kind: k, what: what, proc: m.env.Start(m.t, bin, a...), start: start}
}

// kill SIGKILLs r and records its operation as ended at the kill.
func (m *mixedRun) kill(r *running) time.Time {
	m.t.Helper()
	r.proc.Kill(m.t)
	at := time.Now()
	m.record(mixedOp{kind: r.kind, what: r.what + " (killed)", start: r.start, end: at})
	return at
}

// wait waits for r to exit and records its operation.
func (m *mixedRun) wait(r *running, timeout time.Duration) int {
	m.t.Helper()
	code := r.proc.Wait(m.t, timeout)
	m.record(mixedOp{kind: r.kind, what: fmt.Sprintf("%s (exit %d)", r.what, code), start: r.start, end: time.Now()})
	return code
}

// waitHolder waits until kind's operation r has written revision rev
// pending-upgrade and holds the lock with rev recorded (it is inside helm's
// upgrade), and returns the lock record.
func (m *mixedRun) waitHolder(r *running, rev int) lockRecord {
	m.t.Helper()
	m.env.WaitForStatus(m.t, m.ns, m.rel, rev, "pending-upgrade", 2*time.Minute)
	rec := waitForWriterIn(m.t, m.env, m.read, m.ns, m.rel, rev, time.Minute)
	if rec.Backend != "" && rec.Backend != m.backend {
		m.t.Errorf("%s's lock record says backend %q; it was given --lock-backend %s", r.kind, rec.Backend, m.backend)
	}
	m.t.Logf("%s holds revision %d: session %s, who %s, pid %d, backend %q", r.kind, rev, rec.Session, rec.Who, rec.PID, rec.Backend)
	return lockRecord{session: rec.Session, who: rec.Who}
}

type lockRecord struct{ session, who string }

// revState is what a refused client must leave as it was: the pending
// revision's Secret (resourceVersion, status label, release data) and, with
// the lease backend, the Lease's resourceVersion.
type revState struct {
	secretRV, status, data string
	leaseRV                string
}

func (m *mixedRun) revState(rev int) revState {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := m.env.Client.CoreV1().Secrets(m.ns).Get(ctx, helmx.ReleaseSecretName(m.rel, rev), metav1.GetOptions{})
	if err != nil {
		m.t.Fatalf("revision %d of %s/%s: %v", rev, m.ns, m.rel, err)
	}
	st := revState{secretRV: s.ResourceVersion, status: s.Labels["status"], data: fmt.Sprintf("%x", sha256.Sum256(s.Data[helmx.ReleaseDataKey]))}
	if l, _ := lease(m.t, m.env, m.ns, m.rel); l != nil {
		st.leaseRV = l.ResourceVersion
	}
	return st
}

// heldRefuses: holder's upgrade to revision 2 is held open by pods that
// never schedule; the other kind's upgrade is refused with exit 3 naming
// the holder's session, and the holder's pending revision is untouched.
// Then the holder is stopped with SIGTERM (its revision ends failed, the
// lock free) and the refused client's upgrade succeeds.
func heldRefuses(m *mixedRun, holder, refused clientKind) {
	t := m.t
	m.mustRun(refused, "install", "--wait", "--timeout", "60s")
	deployed := watchDeployed(t, m.env, m.ns, m.rel)

	// A long lease: the holder renews every 40 s, so its renewals rarely
	// change the revision between the two reads around the refusal.
	h := m.start(holder, "upgrade held open", args([]string{"--wait", "--timeout", "5m", "--lease-duration", "2m", "--set", "message=holder"}, unschedulable)...)
	rec := m.waitHolder(h, 2)

	var res testenv.Result
	untouched := false
	for attempt := 1; attempt <= 3 && !untouched; attempt++ {
		before := m.revState(2)
		res = m.run(refused, "upgrade refused", "--set", "message=refused")
		after := m.revState(2)
		if res.ExitCode != exitcode.Locked {
			t.Fatalf("%s upgrade while %s holds the release: exit %d; want %d (locked)\nstdout:\n%s\nstderr:\n%s",
				refused, holder, res.ExitCode, exitcode.Locked, res.Stdout, res.Stderr)
		}
		if !strings.Contains(res.Stderr, rec.session) {
			t.Errorf("the refusal does not name the holder's session %s:\n%s", rec.session, res.Stderr)
		}
		if after.status != "pending-upgrade" || after.data != before.data {
			t.Fatalf("the refused %s upgrade changed %s's revision 2: status %s -> %s, release data changed: %v",
				refused, holder, before.status, after.status, after.data != before.data)
		}
		untouched = after == before
		if !untouched {
			// Only the holder's renewal may have moved it; the audit log
			// check below proves the refused client wrote nothing.
			t.Logf("attempt %d: revision 2 or the Lease moved during the refusal (%+v -> %+v): the holder renewed; again", attempt, before, after)
		}
	}
	if !untouched {
		t.Fatalf("revision 2 never stayed untouched across a refused upgrade in 3 attempts")
	}
	figure(t, "%s holding, %s refused (--lock-backend=%s): exit %d after %s; %s's revision 2 untouched (same resourceVersion, status pending-upgrade)",
		holder, refused, m.backend, res.ExitCode, res.Elapsed.Round(time.Millisecond), holder)
	if got := strings.Join(m.env.Summary(t, m.ns, m.rel), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refusal = %s; want 1:deployed 2:pending-upgrade", got)
	}

	// The holder stops; the refused client then goes ahead.
	h.proc.Signal(t, syscall.SIGTERM)
	code := m.wait(h, 2*time.Minute)
	t.Logf("%s holder exited %d after SIGTERM\nstderr:\n%s", holder, code, h.proc.Stderr.String())
	if code == 0 {
		t.Errorf("the %s holder exited 0 after SIGTERM while its pods never scheduled", holder)
	}
	m.env.WaitForStatus(t, m.ns, m.rel, 2, "failed", 30*time.Second)
	waitLockFreeIn(t, m.env, m.read, m.ns, m.rel, 30*time.Second)
	m.mustRun(refused, "upgrade after the holder", "--set", "message=after")
	revs := wantHistory(t, m.env, m.ns, m.rel, "1:superseded 2:failed 3:deployed")
	if strings.Contains(revs[1].Description, "Abandoned") {
		t.Errorf("the %s holder's own failed revision was recovered by someone else: %q", holder, revs[1].Description)
	}
	deployed.check(t, m.env, m.ns, m.rel)
	m.checkAudit()
}

// killedRecovered: killed's upgrade to revision 2 is SIGKILLed once its
// pending revision appears and it holds the lock; the other kind's upgrade,
// started at once with --lock-timeout, waits for the 3 s lease to expire,
// recovers and succeeds by itself.
func killedRecovered(m *mixedRun, killed, recoverer clientKind) {
	t := m.t
	m.mustRun(recoverer, "install", "--wait", "--timeout", "60s")
	deployed := watchDeployed(t, m.env, m.ns, m.rel)

	k := m.start(killed, "upgrade", args([]string{"--wait", "--timeout", "5m", "--lease-duration", killLease.String(), "--set", "message=killed"}, unschedulable)...)
	rec := m.waitHolder(k, 2)
	killAt := m.kill(k)

	res := m.run(recoverer, "upgrade recovering", "--lock-timeout", "60s", "--lease-duration", killLease.String(), "--set", "message=recovered")
	took := time.Since(killAt)
	if res.ExitCode != 0 {
		t.Fatalf("%s upgrade after %s was killed: exit %d\nstdout:\n%s\nstderr:\n%s\nhistory: %v",
			recoverer, killed, res.ExitCode, res.Stdout, res.Stderr, m.env.Summary(t, m.ns, m.rel))
	}
	figure(t, "%s SIGKILLed, %s recovers (--lock-backend=%s, lease %s): kill to success %s",
		killed, recoverer, m.backend, killLease, secs(took))
	if recoverer == kindCLI && (!strings.Contains(res.Stderr, "recovered") || !strings.Contains(res.Stderr, rec.session)) {
		t.Errorf("the recovering CLI does not report the recovery of session %s:\n%s", rec.session, res.Stderr)
	}

	revs := wantHistory(t, m.env, m.ns, m.rel, "1:superseded 2:failed 3:deployed")
	abandoned(t, revs[1], "pending-upgrade", rec.session)
	t.Logf("abandoned revision 2: %s", revs[1].Description)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := m.env.Client.AppsV1().Deployments(m.ns).Get(ctx, m.rel, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := d.Spec.Template.Spec.NodeSelector; len(sel) != 0 {
		t.Errorf("after the recovery the Deployment keeps the abandoned revision's nodeSelector %v", sel)
	}
	waitLockFreeIn(t, m.env, m.read, m.ns, m.rel, 30*time.Second)
	deployed.check(t, m.env, m.ns, m.rel)
	m.checkAudit()
}

// concurrentUpgrades: the embed program and the CLI upgrade the release
// over and over at the same time; a refused one tries again.
func concurrentUpgrades(m *mixedRun) {
	t := m.t
	m.mustRun(kindCLI, "install", "--wait", "--timeout", "60s")
	deployed := watchDeployed(t, m.env, m.ns, m.rel)
	const rounds = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	refusals := map[clientKind]int{}
	for _, k := range []clientKind{kindEmbed, kindCLI} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(4 * time.Minute)
			done := 0
			for done < rounds && time.Now().Before(deadline) {
				res := m.run(k, fmt.Sprintf("upgrade %d", done+1), "--wait", "--timeout", "60s", "--lease-duration", killLease.String(),
					"--set", fmt.Sprintf("message=%s-%d", k, done+1))
				switch res.ExitCode {
				case 0:
					done++
				case exitcode.Locked:
					mu.Lock()
					refusals[k]++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				default:
					t.Errorf("%s upgrade: exit %d\nstdout:\n%s\nstderr:\n%s", k, res.ExitCode, res.Stdout, res.Stderr)
					return
				}
			}
			if done < rounds {
				t.Errorf("%s: only %d of %d upgrades succeeded in 4 minutes", k, done, rounds)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	figure(t, "embed and CLI upgrading at once (--lock-backend=%s): %d upgrades each, refusals embed %d, CLI %d",
		m.backend, rounds, refusals[kindEmbed], refusals[kindCLI])
	deployed.check(t, m.env, m.ns, m.rel)
	m.checkAudit()
}

// checkAudit reads the audit log: no refused operation wrote anything; the
// span from the first to the last successful write (to the release's
// Secrets or its Lease) of every other operation contains no write by the
// other kind of client; with the release backend neither wrote a Lease.
func (m *mixedRun) checkAudit() {
	t := m.t
	t.Helper()
	// The audit log is written in blocking mode: every write is in it by
	// the time its response arrived.
	writes := readAuditWrites(t, m.auditLog, m.ns)
	byKind := map[clientKind][]auditEvent{}
	for _, w := range writes {
		switch w.ImpersonatedUser.Username {
		case m.user(kindEmbed):
			byKind[kindEmbed] = append(byKind[kindEmbed], w)
		case m.user(kindCLI):
			byKind[kindCLI] = append(byKind[kindCLI], w)
		default:
			t.Errorf("a write by an unexpected user %q: %s %s %s", w.ImpersonatedUser.Username, w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name)
		}
	}
	if len(byKind[kindEmbed]) == 0 || len(byKind[kindCLI]) == 0 {
		t.Fatalf("the audit log holds %d writes by %s and %d by %s in %s; want both", len(byKind[kindEmbed]), m.user(kindEmbed), len(byKind[kindCLI]), m.user(kindCLI), m.ns)
	}
	if m.backend == "release" {
		for k, ws := range byKind {
			for _, w := range ws {
				if w.ObjectRef.Resource == "leases" {
					t.Errorf("%s with --lock-backend=release wrote lease %s (%s at %s)", k, w.ObjectRef.Name, w.Verb, w.StageTimestamp.Format(time.RFC3339Nano))
				}
			}
		}
	}
	m.mu.Lock()
	ops := append([]mixedOp(nil), m.ops...)
	m.mu.Unlock()
	checked, refusedChecked, overlaps := 0, 0, 0
	for _, o := range ops {
		var first, last time.Time
		secretWrites := 0
		for _, w := range byKind[o.kind] {
			if w.RequestReceived.Before(o.start) || w.StageTimestamp.After(o.end) {
				continue
			}
			if o.refused {
				t.Errorf("%s's refused %s wrote %s %s %s at %s", o.kind, o.what, w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name, w.StageTimestamp.Format(time.RFC3339Nano))
				continue
			}
			if first.IsZero() || w.RequestReceived.Before(first) {
				first = w.RequestReceived
			}
			if w.RequestReceived.After(last) {
				last = w.RequestReceived
			}
			if w.ObjectRef.Resource == "secrets" {
				secretWrites++
			}
		}
		if o.refused {
			refusedChecked++
			continue
		}
		if secretWrites == 0 {
			t.Errorf("%s's %s (%s to %s): no successful write to the release's Secrets in the audit log", o.kind, o.what,
				o.start.Format(time.RFC3339Nano), o.end.Format(time.RFC3339Nano))
			continue
		}
		for _, w := range byKind[o.kind.other()] {
			// From first arrival to last arrival (the release): the
			// next holder writes once it has read the release committed,
			// which may be before its answer left a loaded API server
			// (as in TestMixedBackendsNeverOverlap).
			if w.RequestReceived.After(first) && w.RequestReceived.Before(last) {
				overlaps++
				t.Errorf("%s wrote %s %s %s at %s while %s's %s held the release (its writes span %s to %s)",
					o.kind.other(), w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name, w.StageTimestamp.Format(time.RFC3339Nano), o.kind, o.what,
					first.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
			}
		}
		checked++
	}
	figure(t, "audit log (--lock-backend=%s): %d operations checked against %d writes (embed %d, CLI %d), %d refused operations wrote nothing, overlapping write spans: %d",
		m.backend, checked, len(writes), len(byKind[kindEmbed]), len(byKind[kindCLI]), refusedChecked, overlaps)
}

// deployedWatch follows every change of a release's Secrets and remembers
// the most revisions it ever saw deployed at once.
type deployedWatch struct {
	mu       sync.Mutex
	status   map[string]string
	events   int
	restarts int
	max      int
	maxSeen  string
	stop     func()
}

func watchDeployed(t *testing.T, env *testenv.Env, ns, rel string) *deployedWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	secrets := env.Client.CoreV1().Secrets(ns)
	sel := helmx.HistorySelector(rel)
	dw := &deployedWatch{}
	relist := func() (string, error) {
		list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return "", err
		}
		dw.mu.Lock()
		dw.status = map[string]string{}
		for _, s := range list.Items {
			dw.status[s.Name] = s.Labels[helmx.LabelStatus]
		}
		dw.count()
		dw.mu.Unlock()
		return list.ResourceVersion, nil
	}
	rv, err := relist()
	if err != nil {
		cancel()
		t.Fatalf("listing the revisions of %s/%s: %v", ns, rel, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w, err := secrets.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv})
			if err == nil {
				for ev := range w.ResultChan() {
					s, ok := ev.Object.(*corev1.Secret)
					if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted) {
						continue
					}
					rv = s.ResourceVersion
					dw.mu.Lock()
					dw.events++
					if ev.Type == watch.Deleted {
						delete(dw.status, s.Name)
					} else {
						dw.status[s.Name] = s.Labels[helmx.LabelStatus]
					}
					dw.count()
					dw.mu.Unlock()
				}
				w.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			// The watch ended early: read again and go on from there.
			time.Sleep(100 * time.Millisecond)
			dw.mu.Lock()
			dw.restarts++
			dw.mu.Unlock()
			if nrv, err := relist(); err == nil {
				rv = nrv
			}
		}
	}()
	var once sync.Once
	dw.stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(dw.stop)
	return dw
}

// count notes how many revisions are deployed now; called with mu held.
func (dw *deployedWatch) count() {
	n := 0
	for _, s := range dw.status {
		if s == "deployed" {
			n++
		}
	}
	if n > dw.max {
		dw.max = n
		var b []string
		for name, s := range dw.status {
			b = append(b, name+"="+s)
		}
		dw.maxSeen = strings.Join(b, " ")
	}
}

// check stops the watch and fails the test if two revisions were ever
// deployed at once or the watch saw nothing.
func (dw *deployedWatch) check(t *testing.T, env *testenv.Env, ns, rel string) {
	t.Helper()
	// The watch is done once it has seen the history as it now stands.
	want := map[string]string{}
	for _, r := range env.History(t, ns, rel) {
		want[r.Secret.Name] = r.Status
	}
	deadline := time.Now().Add(time.Minute)
	for {
		dw.mu.Lock()
		caught := maps.Equal(dw.status, want)
		dw.mu.Unlock()
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the watch on the release's Secrets never caught up with the history %v", want)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	dw.stop()
	dw.mu.Lock()
	defer dw.mu.Unlock()
	t.Logf("the watch on the release's Secrets saw %d changes (%d restarts); at most %d revision(s) deployed at once", dw.events, dw.restarts, dw.max)
	if dw.events == 0 {
		t.Errorf("the watch on the release's Secrets saw no change")
	}
	if dw.max > 1 {
		t.Errorf("%d revisions were deployed at once: %s", dw.max, dw.maxSeen)
	}
}
