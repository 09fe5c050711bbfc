package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// Values that hold an operation open: pods (or a hook's pod) that match no
// node never become ready, so --wait (or the hook) never finishes.
var (
	unschedulable     = []string{"--set", "nodeSelector.never=matches"}
	hookUnschedulable = []string{"--set", "hook=true", "--set", "hookNodeSelector.never=matches"}
)

// figure logs a measured figure in a greppable form: FIGURE <what>: <value>.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURE "+format, args...)
}

// secs formats a duration as seconds with one decimal.
func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func args(base []string, more ...[]string) []string {
	out := append([]string(nil), base...)
	for _, m := range more {
		out = append(out, m...)
	}
	return out
}

// mustRun runs a command and fails the test unless it exits 0.
func mustRun(t *testing.T, env *testenv.Env, bin string, a ...string) testenv.Result {
	t.Helper()
	res := env.Run(t, bin, a...)
	if res.ExitCode != 0 {
		t.Fatalf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", bin, strings.Join(a, " "), res.ExitCode, res.Stdout, res.Stderr)
	}
	return res
}

// lease reads the lock Lease of release and its record; nil, nil when there
// is no Lease.
func lease(t *testing.T, env *testenv.Env, ns, rel string) (*coordinationv1.Lease, *lock.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		t.Fatalf("reading lease of %s/%s: %v", ns, rel, err)
	}
	rec, err := lock.DecodeRecord(l.Annotations[lock.AnnotationRecord])
	if err != nil {
		t.Fatalf("lease of %s/%s: %v", ns, rel, err)
	}
	return l, rec
}

func holderOf(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// lockReader reads the holder and record of a release's lock from one
// store; leaseLock and recordLock are the two.
type lockReader func(t *testing.T, env *testenv.Env, ns, rel string) (holder string, rec *lock.Record)

// leaseLock reads the lock from the release's Lease.
func leaseLock(t *testing.T, env *testenv.Env, ns, rel string) (string, *lock.Record) {
	l, rec := lease(t, env, ns, rel)
	return holderOf(l), rec
}

// recordLock reads the lock from the annotation of the release's newest
// stored revision (the release backend's store): the holder is the record's
// session unless it was released.
func recordLock(t *testing.T, env *testenv.Env, ns, rel string) (string, *lock.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := env.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: helmx.HistorySelector(rel)})
	if err != nil {
		t.Fatalf("reading the revisions of %s/%s: %v", ns, rel, err)
	}
	var newest *corev1.Secret
	for i := range list.Items {
		s := &list.Items[i]
		if newest == nil || revOf(s) > revOf(newest) {
			newest = s
		}
	}
	if newest == nil {
		return "", nil
	}
	v, ok := newest.Annotations[lock.AnnotationRecord]
	if !ok {
		return "", nil
	}
	rec, err := lock.DecodeRecord(v)
	if err != nil {
		t.Fatalf("lock record on %s/%s: %v", ns, newest.Name, err)
	}
	if !rec.ReleasedAt.IsZero() {
		return "", rec
	}
	return rec.Session, rec
}

// queues returns the waiter queues of the release's lock, on its newest
// record and on its Lease, as stored.
func queues(t *testing.T, env *testenv.Env, ns, rel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := env.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: helmx.HistorySelector(rel)})
	if err != nil {
		t.Fatalf("reading the revisions of %s/%s: %v", ns, rel, err)
	}
	var out string
	var newest *corev1.Secret
	for i := range list.Items {
		if newest == nil || revOf(&list.Items[i]) > revOf(newest) {
			newest = &list.Items[i]
		}
	}
	if newest != nil {
		out = newest.Annotations[lock.AnnotationQueue] // an earlier version's queue
	}
	if b, err := env.Client.CoreV1().Secrets(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{}); err == nil {
		out += b.Annotations[releasestore.AnnotationWaiters] // the beat's
	}
	if l, _ := lease(t, env, ns, rel); l != nil {
		out += l.Annotations[lock.AnnotationQueue]
	}
	return out
}

// queued reports whether queues found a waiter: an entry names its
// session ("session" on a Lease, "s" on the beat).
func queued(q string) bool {
	return strings.Contains(q, `"session"`) || strings.Contains(q, `"s":`)
}

func revOf(s *corev1.Secret) int {
	n, _ := strconv.Atoi(s.Labels[helmx.LabelVersion])
	return n
}

// waitForWriter waits until a session holds the release's Lease and has
// recorded the revision it writes (so it is past recovery and inside helm's
// operation), and returns its record.
func waitForWriter(t *testing.T, env *testenv.Env, ns, rel string, rev int, timeout time.Duration) *lock.Record {
	t.Helper()
	return waitForWriterIn(t, env, leaseLock, ns, rel, rev, timeout)
}

// waitForWriterIn is waitForWriter for the lock read by read.
func waitForWriterIn(t *testing.T, env *testenv.Env, read lockReader, ns, rel string, rev int, timeout time.Duration) *lock.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		h, rec := read(t, env, ns, rel)
		if h != "" && rec != nil && rec.Session == h && rec.Revision == rev {
			return rec
		}
		time.Sleep(50 * time.Millisecond)
	}
	h, rec := read(t, env, ns, rel)
	t.Fatalf("no session recorded revision %d of %s/%s within %s; lock holder %q, record %+v", rev, ns, rel, timeout, h, rec)
	return nil
}

// waitLockFree waits until the Lease has no holder (or is gone) and returns
// how long that took from the call.
func waitLockFree(t *testing.T, env *testenv.Env, ns, rel string, timeout time.Duration) time.Duration {
	t.Helper()
	return waitLockFreeIn(t, env, leaseLock, ns, rel, timeout)
}

// waitLockFreeIn is waitLockFree for the lock read by read.
func waitLockFreeIn(t *testing.T, env *testenv.Env, read lockReader, ns, rel string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if h, _ := read(t, env, ns, rel); h == "" {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h, rec := read(t, env, ns, rel)
	t.Fatalf("lock of %s/%s still held by %q after %s; record %+v", ns, rel, h, timeout, rec)
	return 0
}

// revisions returns the summaries (with descriptions) of every stored
// revision, oldest first.
func revisions(t *testing.T, env *testenv.Env, ns, rel string) []helmx.Summary {
	t.Helper()
	var out []helmx.Summary
	for _, r := range env.History(t, ns, rel) {
		s, err := helmx.Summarize(&r.Secret)
		if err != nil {
			t.Fatalf("revision %d of %s/%s: %v", r.Version, ns, rel, err)
		}
		out = append(out, s)
	}
	return out
}

// wantHistory checks the statuses of the whole history, "1:deployed 2:failed".
func wantHistory(t *testing.T, env *testenv.Env, ns, rel, want string) []helmx.Summary {
	t.Helper()
	revs := revisions(t, env, ns, rel)
	got := make([]string, len(revs))
	for i, r := range revs {
		got[i] = fmt.Sprintf("%d:%s", r.Revision, r.Status)
	}
	if strings.Join(got, " ") != want {
		t.Fatalf("history of %s/%s = %v; want %s\n%s", ns, rel, got, want, describe(revs))
	}
	return revs
}

func describe(revs []helmx.Summary) string {
	var b strings.Builder
	for _, r := range revs {
		fmt.Fprintf(&b, "  %d %s: %s\n", r.Revision, r.Status, r.Description)
	}
	return b.String()
}

// abandoned checks the description recovery wrote into an abandoned revision.
func abandoned(t *testing.T, s helmx.Summary, status, session string) {
	t.Helper()
	if !strings.Contains(s.Description, "Abandoned "+status) || !strings.Contains(s.Description, session) {
		t.Fatalf("revision %d description = %q; want it to say %q and name session %s", s.Revision, s.Description, "Abandoned "+status, session)
	}
}

// leaseEvent is one change of the Lease seen by a watch, stamped with the
// local time it arrived.
type leaseEvent struct {
	at     time.Time
	typ    watch.EventType
	holder string
	rec    *lock.Record
}

// leaseWatch records every change of a release's Lease from now on.
type leaseWatch struct {
	mu     sync.Mutex
	events []leaseEvent
	stop   func()
}

func watchLease(t *testing.T, env *testenv.Env, ns, rel string) *leaseWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := env.Client.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", lock.LeaseName(rel)).String(),
	})
	if err != nil {
		cancel()
		t.Fatalf("watching the lease of %s/%s: %v", ns, rel, err)
	}
	lw := &leaseWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			e := leaseEvent{at: time.Now(), typ: ev.Type, holder: holderOf(l)}
			if ev.Type == watch.Deleted {
				e.holder = ""
			}
			if rec, err := lock.DecodeRecord(l.Annotations[lock.AnnotationRecord]); err == nil {
				e.rec = rec
			}
			lw.mu.Lock()
			lw.events = append(lw.events, e)
			lw.mu.Unlock()
		}
	}()
	lw.stop = func() {
		w.Stop()
		cancel()
		<-done
	}
	t.Cleanup(lw.stop)
	return lw
}

func (lw *leaseWatch) snapshot() []leaseEvent {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return append([]leaseEvent(nil), lw.events...)
}

// kwokNode is the one node of the local cluster.
func kwokNode(t *testing.T, env *testenv.Env) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("listing nodes: %v (%d nodes)", err, len(nodes.Items))
	}
	return nodes.Items[0].Name
}

// pendingPods lists the unbound pods in ns whose labels match selector.
func pendingPods(t *testing.T, env *testenv.Env, ns, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("listing pods %q in %s: %v", selector, ns, err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// bind puts a pod on node directly, past the scheduler and its nodeSelector:
// the way a test ends a wait it made unschedulable, at a moment it chooses.
func bind(t *testing.T, env *testenv.Env, ns string, pod corev1.Pod, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := env.Client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("binding pod %s/%s to %s: %v", ns, pod.Name, node, err)
	}
}
