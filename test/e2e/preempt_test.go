package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// Cooperative preemption (issue 34, item 5) against the real cluster. Each
// client acts as a user of its own (--kube-as-user), so that the API
// server's audit log says who wrote what, and in which order: the evidence
// that a holder asked to stop wrote nothing after the one that asked began
// to write.

// What the holder and the preemptor say on stderr.
const (
	askedToStop    = "asked this operation to stop (--preempt)"
	goesOnForNow   = "it goes on for now: "
	askedTheHolder = "asked the holder of the lock"
)

// preemptCase is one scenario: a release in its own namespace and the
// commands of its clients, with one lock backend.
type preemptCase struct {
	t              *testing.T
	env            *testenv.Env
	bin, chart     string
	ns, rel        string
	backend        []string // --lock-backend, when not the default
	read           lockReader
	node, auditLog string
	procs          []*testenv.Proc
}

func newPreemptCase(t *testing.T, rel, backend string) *preemptCase {
	t.Helper()
	env := testenv.Get(t)
	pc := &preemptCase{
		t: t, env: env, bin: env.Bin(t), chart: env.Chart("app"), ns: env.Namespace(t), rel: rel,
		read: leaseLock, auditLog: testenv.AuditLog(),
	}
	if _, err := os.Stat(pc.auditLog); err != nil {
		t.Fatalf("this test reads the local cluster's audit log: %v", err)
	}
	if backend == "release" {
		pc.backend, pc.read = []string{"--lock-backend", "release"}, recordLock
	}
	pc.node = kwokNode(t, env)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the audit log of %s:\n%s", pc.ns, pc.trail())
			for _, p := range pc.procs {
				t.Logf("stderr of %s:\n%s", strings.Join(p.Cmd.Args[1:], " "), p.Stderr.String())
			}
		}
	})
	return pc
}

// args returns the arguments of command (upgrade, rollback...) on the
// release, run as user, with more after.
func (pc *preemptCase) args(user, command string, more ...string) []string {
	a := []string{command, pc.rel}
	if command == "install" || command == "upgrade" {
		a = append(a, pc.chart)
	}
	a = append(a, "-n", pc.ns, "--kube-as-user", user, "--kube-as-group", "system:masters")
	return append(append(a, pc.backend...), more...)
}

func (pc *preemptCase) run(user, command string, more ...string) {
	pc.t.Helper()
	mustRun(pc.t, pc.env, pc.bin, pc.args(user, command, more...)...)
}

func (pc *preemptCase) start(user, command string, more ...string) *testenv.Proc {
	pc.t.Helper()
	p := pc.env.Start(pc.t, pc.bin, pc.args(user, command, more...)...)
	pc.procs = append(pc.procs, p)
	return p
}

// waitWaiter waits until a waiter not among known is in the release's
// queue and returns it.
func (pc *preemptCase) waitWaiter(p *testenv.Proc, known ...string) lock.Waiter {
	pc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, w := range waitersOf(pc.t, pc.env, pc.ns, pc.rel) {
			if !slices.Contains(known, w.Session) {
				return w
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	pc.t.Fatalf("no new waiter queued for %s/%s within 60s; queues %s\nits stderr:\n%s", pc.ns, pc.rel, queues(pc.t, pc.env, pc.ns, pc.rel), p.Stderr.String())
	return lock.Waiter{}
}

// waitSaid waits until p has said all of parts on stderr.
func (pc *preemptCase) waitSaid(p *testenv.Proc, who string, parts ...string) {
	pc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if saidAll(p.Stderr.String(), parts...) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	pc.t.Fatalf("%s did not say %q within 60s; stderr:\n%s", who, parts, p.Stderr.String())
}

func saidAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// exits waits for p's exit and checks its code.
func (pc *preemptCase) exits(p *testenv.Proc, who string, want int) {
	pc.t.Helper()
	if code := p.Wait(pc.t, 2*time.Minute); code != want {
		pc.t.Fatalf("%s: exit %d, want %d\nstderr:\n%s", who, code, want, p.Stderr.String())
	}
}

// bindPending binds the pods of selector that wait for a node, ending the
// wait (or the hook) that holds an operation open; it fails when there is
// none within a minute.
func (pc *preemptCase) bindPending(selector string) time.Time {
	pc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pods := pendingPods(pc.t, pc.env, pc.ns, selector); len(pods) > 0 {
			at := time.Now()
			for _, p := range pods {
				bind(pc.t, pc.env, pc.ns, p, pc.node)
			}
			return at
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("no pending pod %q in %s within 60s", selector, pc.ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exitBinding waits for p's exit and returns its code, binding meanwhile
// the pods of selector that wait for a node: an operation that goes on
// into --wait then ends.
func (pc *preemptCase) exitBinding(p *testenv.Proc, selector string) int {
	pc.t.Helper()
	exited := make(chan struct{})
	go func() {
		_ = p.Cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-exited:
			return p.Cmd.ProcessState.ExitCode()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("%s did not exit within 2m; stderr:\n%s", strings.Join(p.Cmd.Args[1:], " "), p.Stderr.String())
		}
		for _, pod := range pendingPods(pc.t, pc.env, pc.ns, selector) {
			bind(pc.t, pc.env, pc.ns, pod, pc.node)
		}
	}
}

// preempted checks that revision rev was marked failed by its holder
// hSession at the request of session asker.
func preempted(t *testing.T, s helmx.Summary, hSession, asker string) {
	t.Helper()
	if s.Status != "failed" || !strings.HasPrefix(s.Description, "Preempted pending-") ||
		!strings.Contains(s.Description, "stopped at the request of") || !strings.Contains(s.Description, "session "+asker) ||
		!strings.Contains(s.Description, "helm-autorecover session "+hSession) {
		t.Fatalf("revision %d: %s %q; want failed, preempted by session %s, marked by its holder %s", s.Revision, s.Status, s.Description, asker, hSession)
	}
}

// waitersOf returns the waiters queued for the release's lock: on its
// Lease, and on the beat Secret (where the release backend's queue lives).
func waitersOf(t *testing.T, env *testenv.Env, ns, rel string) []lock.Waiter {
	t.Helper()
	var out []lock.Waiter
	if l, _ := lease(t, env, ns, rel); l != nil && l.Annotations[lock.AnnotationQueue] != "" {
		var q struct {
			Waiters []lock.Waiter `json:"waiters"`
		}
		if err := json.Unmarshal([]byte(l.Annotations[lock.AnnotationQueue]), &q); err != nil {
			t.Fatalf("the queue on the lease of %s/%s: %v", ns, rel, err)
		}
		out = append(out, q.Waiters...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if b, err := env.Client.CoreV1().Secrets(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{}); err == nil && b.Annotations[releasestore.AnnotationWaiters] != "" {
		var ws []struct {
			Session string `json:"s"`
			Preempt bool   `json:"p"`
		}
		if err := json.Unmarshal([]byte(b.Annotations[releasestore.AnnotationWaiters]), &ws); err != nil {
			t.Fatalf("the queue on the beat of %s/%s: %v", ns, rel, err)
		}
		for _, w := range ws {
			out = append(out, lock.Waiter{Session: w.Session, Preempt: w.Preempt})
		}
	}
	return out
}

// trail is the audit log's successful writes in the namespace of a case
// (release records, the lock's objects, the chart's ConfigMaps), in log
// order.
type trail struct {
	rel    string
	writes []testenv.AuditEvent
}

func (pc *preemptCase) trail() trail {
	pc.t.Helper()
	writes, err := testenv.ReadAuditWritesOf(pc.auditLog, pc.ns, "secrets", "configmaps", "leases")
	if err != nil {
		pc.t.Fatal(err)
	}
	return trail{rel: pc.rel, writes: writes}
}

func (tr trail) of(user string) []testenv.AuditEvent {
	var out []testenv.AuditEvent
	for _, w := range tr.writes {
		if w.ImpersonatedUser.Username == user {
			out = append(out, w)
		}
	}
	return out
}

// lockObject reports whether w wrote the lock's Lease or beat, where
// waiters queue: a waiter writes them before it holds the lock.
func (tr trail) lockObject(w testenv.AuditEvent) bool {
	return w.ObjectRef.Name == lock.LeaseName(tr.rel)
}

// firstWrite is user's first write other than to the lock's own objects:
// the first it made holding the lock.
func (tr trail) firstWrite(t *testing.T, user string) testenv.AuditEvent {
	t.Helper()
	for _, w := range tr.of(user) {
		if !tr.lockObject(w) {
			return w
		}
	}
	t.Fatalf("%s wrote nothing but the lock's objects; the writes:\n%s", user, tr)
	return testenv.AuditEvent{}
}

// creator is the user that created revision rev's record.
func (tr trail) creator(rev int) string {
	name := helmx.ReleaseSecretName(tr.rel, rev)
	for _, w := range tr.writes {
		if w.Verb == "create" && w.ObjectRef.Resource == "secrets" && w.ObjectRef.Name == name {
			return w.ImpersonatedUser.Username
		}
	}
	return ""
}

// handedOver checks that every write of from arrived at the API server
// before to's first write holding the lock did: their writes do not
// overlap. (from's last write is its release, which to writes after only
// once it has read it committed: possibly before its answer left a loaded
// API server, so answers are not compared.)
func (tr trail) handedOver(t *testing.T, from, to string) {
	t.Helper()
	first := tr.firstWrite(t, to)
	for _, w := range tr.of(from) {
		if !w.RequestReceived.Before(first.RequestReceived) {
			t.Errorf("%s wrote %s %s/%s (received %s) after %s's first write (%s %s/%s received %s)\n%s", from,
				w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name, stamp(w.RequestReceived), to,
				first.Verb, first.ObjectRef.Resource, first.ObjectRef.Name, stamp(first.RequestReceived), tr)
		}
	}
}

// creators checks who created each revision from 2 on.
func (tr trail) creators(t *testing.T, users ...string) {
	t.Helper()
	for i, u := range users {
		if got := tr.creator(i + 2); got != u {
			t.Errorf("revision %d was created by %q, want %q\n%s", i+2, got, u, tr)
		}
	}
}

func (tr trail) String() string {
	var b strings.Builder
	for _, w := range tr.writes {
		fmt.Fprintf(&b, "  %s..%s %-10s %-6s %s/%s\n", stamp(w.RequestReceived), stamp(w.StageTimestamp),
			w.ImpersonatedUser.Username, w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name)
	}
	return b.String()
}

func stamp(t time.Time) string { return t.Local().Format("15:04:05.000000") }

// TestPreemptHolderInWait: a holder in `upgrade --wait` (pods that never
// schedule) is asked to stop by an `upgrade --preempt`. It stops as on a
// first SIGINT: exit 11, its revision failed naming the preemptor's
// session; the preemptor deploys the next revision; by the audit log, the
// holder wrote nothing once the preemptor began to write. With both lock
// backends (the release backend's queue lives on the beat Secret, which the
// holder watches instead of the Lease).
func TestPreemptHolderInWait(t *testing.T) {
	for _, backend := range []string{"lease", "release"} {
		t.Run(backend, func(t *testing.T) {
			pc := newPreemptCase(t, "inwait", backend)
			pc.run("setup", "install", "--wait", "--timeout", "60s")
			h := pc.start("holder", "upgrade", args([]string{"--wait", "--timeout", "2m", "--set", "message=holder"}, unschedulable)...)
			hRec := waitForWriterIn(t, pc.env, pc.read, pc.ns, pc.rel, 2, 60*time.Second)

			p := pc.start("preemptor", "upgrade", "--preempt", "--lock-timeout", "2m", "--set", "message=preemptor")
			asker := pc.waitWaiter(p, hRec.Session)
			if !asker.Preempt {
				t.Fatalf("the preemptor's queue entry is not marked preempt: %+v", asker)
			}
			pc.exits(h, "holder", exitcode.Preempted)
			pc.exits(p, "preemptor", 0)

			if s := h.Stderr.String(); !saidAll(s, askedToStop, guard.PreemptStarted, asker.Session) {
				t.Errorf("the holder's stderr does not say who asked it to stop:\n%s", s)
			}
			if s := p.Stderr.String(); !saidAll(s, askedTheHolder, hRec.Session) {
				t.Errorf("the preemptor's stderr does not say it asked the holder %s:\n%s", hRec.Session, s)
			}
			revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:deployed")
			preempted(t, revs[1], hRec.Session, asker.Session)
			if _, rec := pc.read(t, pc.env, pc.ns, pc.rel); rec == nil || rec.Session != asker.Session || rec.Revision != 3 {
				t.Errorf("the lock's last record = %+v; want the preemptor's (session %s) for revision 3", rec, asker.Session)
			}
			tr := pc.trail()
			tr.creators(t, "holder", "preemptor")
			tr.handedOver(t, "holder", "preemptor")
			if q := tr.of("preemptor"); len(q) > 0 {
				figure(t, "preempt (%s backend), holder in --wait: the preemptor's first write (its queue entry) to its first write holding the lock: %s",
					backend, tr.firstWrite(t, "preemptor").RequestReceived.Sub(q[0].RequestReceived).Round(time.Millisecond))
			}
		})
	}
}

// holdInHook starts, as user holder, an upgrade held in its pre-upgrade
// hook (a Job whose pod never schedules until the test binds it) and then
// in --wait (pods that never schedule), and waits until its hook's pod is
// pending. It returns the holder and its lock record.
func (pc *preemptCase) holdInHook() (*testenv.Proc, *lock.Record) {
	pc.t.Helper()
	pc.run("setup", "install", "--wait", "--timeout", "60s")
	hArgs := []string{"--wait", "--timeout", "2m", "--set", "message=holder", "--set", "hookEvents=pre-upgrade"}
	h := pc.start("holder", "upgrade", args(hArgs, hookUnschedulable, unschedulable)...)
	rec := waitForWriterIn(pc.t, pc.env, pc.read, pc.ns, pc.rel, 2, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for len(pendingPods(pc.t, pc.env, pc.ns, "job-name="+pc.rel+"-hook")) == 0 {
		if time.Now().After(deadline) {
			pc.t.Fatalf("the holder's hook pod never appeared; stderr:\n%s", h.Stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return h, rec
}

// TestPreemptWaitsForHook: a holder asked to stop while its pre-upgrade
// hook runs says it goes on for now and does not stop: stopping half-way
// could leave what the hook does half done. Once the hook ended (helm
// deleted its Job, as its hook-succeeded policy says), it stops: exit 11,
// its revision failed naming the preemptor, who then deploys. By the audit
// log: the preemptor asked before the hook could end; the holder's write
// marking its revision failed came after.
func TestPreemptWaitsForHook(t *testing.T) {
	pc := newPreemptCase(t, "inhook", "lease")
	h, hRec := pc.holdInHook()

	p := pc.start("preemptor", "upgrade", "--preempt", "--lock-timeout", "2m", "--set", "message=preemptor")
	asker := pc.waitWaiter(p, hRec.Session)
	pc.waitSaid(h, "holder", askedToStop, goesOnForNow, "pre-upgrade hook of the chart is running")
	if holder, _ := pc.read(t, pc.env, pc.ns, pc.rel); holder != hRec.Session {
		t.Fatalf("the lock is held by %q while the holder's hook runs; want the holder %s", holder, hRec.Session)
	}
	if got := strings.Join(pc.env.Summary(t, pc.ns, pc.rel), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history while the hook runs = %s; want 1:deployed 2:pending-upgrade", got)
	}
	hookEnded := pc.bindPending("job-name=" + pc.rel + "-hook")
	pc.exits(h, "holder", exitcode.Preempted)
	pc.exits(p, "preemptor", 0)

	revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:deployed")
	preempted(t, revs[1], hRec.Session, asker.Session)
	tr := pc.trail()
	tr.creators(t, "holder", "preemptor")
	tr.handedOver(t, "holder", "preemptor")
	// The ask came before the hook ended.
	if q := tr.of("preemptor"); len(q) == 0 || !tr.lockObject(q[0]) || !q[0].StageTimestamp.Before(hookEnded) {
		t.Errorf("the preemptor's first write is not its queue entry before the hook ended (%s)\n%s", stamp(hookEnded), tr)
	}
	// The holder marked its revision failed only after the test let the
	// hook end (its pod could not run before), and helm's own deletion of
	// the hook's Job once it succeeded (hook-succeeded) went through the
	// holder's write fence: the hook ran to its end under the lock.
	var failed *testenv.AuditEvent
	for _, w := range tr.of("holder") {
		if w.ObjectRef.Name == helmx.ReleaseSecretName(pc.rel, 2) {
			failed = &w // the last one
		}
	}
	if failed == nil || !failed.RequestReceived.After(hookEnded) {
		t.Errorf("the holder's last write of revision 2 (its failure) is not after the hook's pod was let run (%s)\n%s", stamp(hookEnded), tr)
	}
	jobs := pc.env.Client.BatchV1().Jobs(pc.ns)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := jobs.Get(t.Context(), pc.rel+"-hook", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hook's Job is still there 30s after the holder exited (%v): helm did not see it succeed and delete it before the holder stopped", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPreemptTwoPreemptors: while the holder's hook runs (it does not stop
// yet), P1 asks to preempt, then a second client queues behind P1. When the
// hook ends the holder stops and P1, first in arrival order, takes the
// lock, whether or not the second asked too.
//   - both ask: P1, itself held in --wait, is stopped in turn at P2's
//     request; P2 deploys. History: 2 failed (asked by P1), 3 failed (asked
//     by P2), 4 deployed.
//   - the second only waits (no --preempt): P1 is not stopped; its wait
//     ends (the test binds its pods) and it deploys; then the second runs.
func TestPreemptTwoPreemptors(t *testing.T) {
	t.Run("both ask", func(t *testing.T) {
		pc := newPreemptCase(t, "two", "lease")
		h, hRec := pc.holdInHook()
		p1 := pc.start("p1", "upgrade", args([]string{"--preempt", "--lock-timeout", "2m", "--wait", "--timeout", "2m", "--set", "message=p1"}, unschedulable)...)
		a1 := pc.waitWaiter(p1, hRec.Session)
		pc.waitSaid(h, "holder", askedToStop, a1.Session, goesOnForNow)
		p2 := pc.start("p2", "upgrade", "--preempt", "--lock-timeout", "2m", "--set", "message=p2")
		a2 := pc.waitWaiter(p2, hRec.Session, a1.Session)
		if !a1.Preempt || !a2.Preempt {
			t.Fatalf("queue entries not marked preempt: %+v, %+v", a1, a2)
		}
		pc.bindPending("job-name=" + pc.rel + "-hook")
		pc.exits(h, "holder", exitcode.Preempted)
		pc.exits(p1, "p1", exitcode.Preempted)
		pc.exits(p2, "p2", 0)

		revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:failed 4:deployed")
		preempted(t, revs[1], hRec.Session, a1.Session)
		preempted(t, revs[2], a1.Session, a2.Session)
		tr := pc.trail()
		tr.creators(t, "holder", "p1", "p2")
		tr.handedOver(t, "holder", "p1")
		tr.handedOver(t, "p1", "p2")
	})
	t.Run("second only waits", func(t *testing.T) {
		pc := newPreemptCase(t, "twowait", "lease")
		h, hRec := pc.holdInHook()
		// A short lease: P1 renews every 2 s, which shows it held on.
		p1Args := []string{"--preempt", "--lock-timeout", "2m", "--wait", "--timeout", "2m", "--lease-duration", "6s", "--set", "message=p1"}
		p1 := pc.start("p1", "upgrade", args(p1Args, unschedulable)...)
		a1 := pc.waitWaiter(p1, hRec.Session)
		pc.waitSaid(h, "holder", askedToStop, a1.Session, goesOnForNow)
		w2 := pc.start("w2", "upgrade", "--lock-timeout", "2m", "--set", "message=w2")
		a2 := pc.waitWaiter(w2, hRec.Session, a1.Session)
		if a2.Preempt {
			t.Fatalf("the plain waiter's queue entry is marked preempt: %+v", a2)
		}
		pc.bindPending("job-name=" + pc.rel + "-hook")
		pc.exits(h, "holder", exitcode.Preempted)

		// P1 holds the lock, in --wait, while W2 waits behind it. P1
		// watches its queue from a second into its operation; it renews
		// every 2 s: once its record shows two renewals after the take,
		// it has seen W2's entry for more than a second and gone on.
		deadline := time.Now().Add(60 * time.Second)
		for {
			l, rec := lease(t, pc.env, pc.ns, pc.rel)
			if holderOf(l) == a1.Session && rec != nil && rec.RenewedAt.Sub(rec.AcquiredAt) >= 4*time.Second {
				break
			}
			if got := pc.env.Summary(t, pc.ns, pc.rel); len(got) > 2 && got[2] != "3:pending-upgrade" {
				t.Fatalf("P1's revision is %s while it should be in --wait (history %v)\nP1's stderr:\n%s", got[2], got, p1.Stderr.String())
			}
			if time.Now().After(deadline) {
				t.Fatalf("P1 did not hold the lock through two renewals within 60s; lock %q %+v\nP1's stderr:\n%s", holderOf(l), rec, p1.Stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if ws := waitersOf(t, pc.env, pc.ns, pc.rel); !slices.ContainsFunc(ws, func(w lock.Waiter) bool { return w.Session == a2.Session }) {
			t.Fatalf("W2 is not queued while P1 holds the lock: %+v", ws)
		}
		pc.bindPending("app=" + pc.rel)
		pc.exits(p1, "p1", 0)
		pc.exits(w2, "w2", 0)
		if strings.Contains(p1.Stderr.String(), askedToStop) {
			t.Errorf("P1 says it was asked to stop, although W2 did not ask:\n%s", p1.Stderr.String())
		}

		revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:superseded 4:deployed")
		preempted(t, revs[1], hRec.Session, a1.Session)
		tr := pc.trail()
		tr.creators(t, "holder", "p1", "w2")
		tr.handedOver(t, "holder", "p1")
		tr.handedOver(t, "p1", "w2")
	})
}

// TestPreemptorKilled: a preemptor killed (SIGKILL) after it queued its
// request, while the holder could not stop yet (its pre-upgrade hook runs):
// the holder acts on the request of a client that is gone. Once the hook
// ended it either stops (exit 11, its revision failed naming the dead
// asker) or, its wait ended by the test, finishes (exit 0); either way the
// lock ends free, the dead preemptor's entry holds the next upgrade back no
// longer than the entry's lease, and nothing is left pending.
func TestPreemptorKilled(t *testing.T) {
	pc := newPreemptCase(t, "killedasker", "lease")
	h, hRec := pc.holdInHook()
	p := pc.start("preemptor", "upgrade", "--preempt", "--lock-timeout", "2m", "--lease-duration", "6s", "--set", "message=preemptor")
	asker := pc.waitWaiter(p, hRec.Session)
	pc.waitSaid(h, "holder", askedToStop, asker.Session, goesOnForNow)
	p.Kill(t)
	pc.bindPending("job-name=" + pc.rel + "-hook")
	// End the holder's wait in case it does not stop.
	code := pc.exitBinding(h, "app="+pc.rel)
	if code != 0 && code != exitcode.Preempted {
		t.Fatalf("holder: exit %d, want 0 or %d\nstderr:\n%s", code, exitcode.Preempted, h.Stderr.String())
	}
	pc.run("next", "upgrade", "--lock-timeout", "60s", "--set", "message=next")
	waitLockFree(t, pc.env, pc.ns, pc.rel, 30*time.Second)

	if code == exitcode.Preempted {
		revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:deployed")
		preempted(t, revs[1], hRec.Session, asker.Session)
	} else {
		wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:superseded 3:deployed")
	}
	figure(t, "killed preemptor: holder exit %d; history %v", code, pc.env.Summary(t, pc.ns, pc.rel))
	tr := pc.trail()
	tr.creators(t, "holder", "next")
	tr.handedOver(t, "holder", "next")
	if ws := tr.of("preemptor"); slices.ContainsFunc(ws, func(w testenv.AuditEvent) bool { return !tr.lockObject(w) }) {
		t.Errorf("the killed preemptor wrote more than its queue entry:\n%s", tr)
	}
}

// TestPreemptHolderAPIStalled: the holder's API server stops answering (a
// proxy that holds every byte) while it is in --wait, so it cannot see a
// request to stop. Nothing is taken from a holder that does not stop: the
// preemptor waits until the holder's lock has expired in the API server's
// clock, then recovers the release as any client does (the holder's
// revision reads "Abandoned", not "Preempted").
func TestPreemptHolderAPIStalled(t *testing.T) {
	pc := newPreemptCase(t, "stalledholder", "lease")
	pc.run("setup", "install", "--wait", "--timeout", "60s")
	proxy, kubeconfig := startStallProxy(t, pc.env)
	hArgs := []string{"--kubeconfig", kubeconfig, "--wait", "--timeout", "2m", "--lease-duration", "6s", "--set", "message=holder"}
	h := pc.start("holder", "upgrade", args(hArgs, unschedulable)...)
	// In --wait: helm wrote its pending revision and then the chart.
	pc.env.WaitForStatus(t, pc.ns, pc.rel, 2, "pending-upgrade", 60*time.Second)
	hRec := waitForWriter(t, pc.env, pc.ns, pc.rel, 2, 60*time.Second)
	lw := watchLease(t, pc.env, pc.ns, pc.rel)
	proxy.Stall()

	p := pc.start("preemptor", "upgrade", "--preempt", "--lock-timeout", "2m", "--set", "message=preemptor")
	asker := pc.waitWaiter(p, hRec.Session)
	pc.exits(p, "preemptor", 0)
	exited := make(chan int, 1)
	go func() {
		_ = h.Cmd.Wait()
		exited <- h.Cmd.ProcessState.ExitCode()
	}()

	// The preemptor's first record on the Lease (its claim, or its take)
	// names the holder it took over from and that holder's LOCKED TILL.
	var hTill time.Time
	var take *lock.Record
	for _, e := range lw.snapshot() {
		switch {
		case e.holder == hRec.Session && e.rec != nil && e.rec.LockedTill.After(hTill):
			hTill = e.rec.LockedTill
		case e.rec != nil && e.rec.Session == asker.Session && take == nil:
			take = e.rec
		}
	}
	switch {
	case hTill.IsZero() || take == nil:
		t.Fatalf("the lease watch saw no holder's LOCKED TILL (%s) or no take by the preemptor (%+v)", hTill, take)
	case take.Abandoned == nil || take.Abandoned.Session != hRec.Session || !take.Abandoned.LockedTill.Equal(hTill):
		t.Errorf("the preemptor's take does not record the holder it took over from (session %s, LOCKED TILL %s): %+v", hRec.Session, hTill, take.Abandoned)
	}
	revs := wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:failed 3:deployed")
	abandoned(t, revs[1], "pending-upgrade", hRec.Session)
	// The holder's LOCKED TILL in the API server's own clock: the record's
	// is an upper bound (Date headers count whole seconds, see
	// docs/protocol.md), and a waiter that saw the lock unchanged for a
	// lease on its own clock may take it before that bound; the holder
	// stops writing a lease after it sent its last renewal. By the audit
	// log, the preemptor's first write holding the lock was received more
	// than a lease after the holder's last write to its lock was.
	tr := pc.trail()
	tr.creators(t, "holder", "preemptor")
	var renewed time.Time
	for _, w := range tr.of("holder") {
		if tr.lockObject(w) {
			renewed = w.RequestReceived
		}
	}
	serverTill := renewed.Add(hRec.LeaseDuration.Duration)
	first := tr.firstWrite(t, "preemptor")
	if renewed.IsZero() || !first.RequestReceived.After(serverTill) {
		t.Errorf("the preemptor's first write holding the lock (%s) came before the holder's lock expired in the API server's clock (last renewal received %s, lease %s)\n%s",
			stamp(first.RequestReceived), stamp(renewed), hRec.LeaseDuration.Duration, tr)
	}
	figure(t, "stalled holder: the preemptor's first write holding the lock came %s after the holder's lock expired in the API server's clock (record's LOCKED TILL, an upper bound: %s)",
		first.RequestReceived.Sub(serverTill).Round(time.Millisecond), first.RequestReceived.Sub(hTill).Round(time.Millisecond))

	// The holder cannot have seen the request; it stops on its own at its
	// renew deadline (lock lost), or the test ends it.
	var code int
	select {
	case code = <-exited:
	case <-time.After(30 * time.Second):
		_ = h.Cmd.Process.Kill()
		code = <-exited
	}
	if code != exitcode.LockLost && code != -1 {
		t.Errorf("the stalled holder: exit %d, want %d (lock lost) or killed\nstderr:\n%s", code, exitcode.LockLost, h.Stderr.String())
	}
	if strings.Contains(h.Stderr.String(), askedToStop) {
		t.Errorf("the stalled holder says it was asked to stop:\n%s", h.Stderr.String())
	}
}

// TestPreemptRollbackDeclines: a rollback cannot be cancelled, so its
// holder declines a request to stop, says why, and goes on; the preemptor
// says it will wait and takes the lock only once the rollback has ended
// (here with success: the test binds its pods).
func TestPreemptRollbackDeclines(t *testing.T) {
	pc := newPreemptCase(t, "rollingback", "lease")
	// Revision 1's pods never schedule; rolling back to it waits.
	pc.run("setup", "install", unschedulable...)
	pc.run("setup", "upgrade", "--set", "message=two")
	h := pc.start("holder", "rollback", "1", "--wait", "--timeout", "2m")
	hRec := waitForWriterIn(t, pc.env, pc.read, pc.ns, pc.rel, 3, 60*time.Second)

	p := pc.start("preemptor", "upgrade", "--preempt", "--lock-timeout", "2m", "--set", "message=preemptor")
	pc.waitWaiter(p, hRec.Session)
	pc.waitSaid(h, "holder", askedToStop, goesOnForNow+"helm cannot cancel a rollback")
	pc.waitSaid(p, "preemptor", askedTheHolder, "but it will not: helm cannot cancel a rollback")
	if holder, _ := pc.read(t, pc.env, pc.ns, pc.rel); holder != hRec.Session {
		t.Fatalf("the lock is held by %q during the rollback; want the holder %s", holder, hRec.Session)
	}
	pc.bindPending("app=" + pc.rel)
	pc.exits(h, "holder", 0)
	pc.exits(p, "preemptor", 0)

	wantHistory(t, pc.env, pc.ns, pc.rel, "1:superseded 2:superseded 3:superseded 4:deployed")
	tr := pc.trail()
	tr.creators(t, "setup", "holder", "preemptor")
	tr.handedOver(t, "holder", "preemptor")
}

// TestPreemptOnlyGuardedCommands: recover and unlock never preempt;
// --preempt is unknown to them (a usage error, exit 2).
func TestPreemptOnlyGuardedCommands(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	for _, a := range [][]string{{"recover", "any", "--preempt"}, {"unlock", "any", "--preempt"}} {
		res := env.Run(t, bin, a...)
		if res.ExitCode != exitcode.Usage || !strings.Contains(res.Stderr, "unknown flag: --preempt") {
			t.Errorf("%s: exit %d, want %d (usage), and unknown flag: --preempt\nstderr:\n%s", strings.Join(a, " "), res.ExitCode, exitcode.Usage, res.Stderr)
		}
	}
}
