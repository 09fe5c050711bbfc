package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Lease durations of the holders these tests start: a live holder renews
// every 2 s and has 5 s to do it, which a busy 2-core machine manages; a
// holder that is killed expires 3 s (plus the 1 s margin) after its last
// renewal.
const (
	liveLease = "6s"
	deadLease = "3s"
)

// it is one integration test's view of the cluster.
type it struct {
	t   *testing.T
	env *testenv.Env
	ha  string
	ns  string
}

func newIT(t *testing.T) *it {
	t.Helper()
	env := testenv.Get(t)
	return &it{t: t, env: env, ha: env.Bin(t), ns: env.Namespace(t)}
}

// run runs helm-autorecover with args (and -n NS) and checks the exit code.
func (x *it) run(code int, args ...string) testenv.Result {
	x.t.Helper()
	res := x.env.Run(x.t, x.ha, append(args, "-n", x.ns)...)
	if res.ExitCode != code {
		x.t.Fatalf("helm-autorecover %s: exit %d; want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.ExitCode, code, res.Stdout, res.Stderr)
	}
	return res
}

func (x *it) helm4(code int, args ...string) testenv.Result {
	x.t.Helper()
	res := x.env.Run(x.t, x.env.Helm4, append(args, "-n", x.ns)...)
	if res.ExitCode != code {
		x.t.Fatalf("helm %s: exit %d; want %d\nstderr:\n%s", strings.Join(args, " "), res.ExitCode, code, res.Stderr)
	}
	return res
}

// install installs rel with helm-autorecover (bin "") or stock helm 4.
func (x *it) install(stock bool, rel string) {
	x.t.Helper()
	a := []string{"install", rel, x.env.Chart("app"), "--wait", "--timeout", "60s"}
	if stock {
		x.helm4(0, a...)
		return
	}
	x.run(0, a...)
}

// holder is a guarded upgrade held open by an unschedulable pod.
type holder struct {
	proc    *testenv.Proc
	session string
}

// hold starts a guarded upgrade of rel (revision rev) that waits for ever,
// and returns once it holds the lock and has recorded its revision.
func (x *it) hold(rel string, rev int, leaseDuration string) holder {
	x.t.Helper()
	p := x.env.Start(x.t, x.ha, "upgrade", rel, x.env.Chart("app"), "-n", x.ns, "--wait", "--timeout", "5m",
		"--lease-duration", leaseDuration, "--set", "nodeSelector.never=matches", "--set", "message=v"+fmt.Sprint(rev))
	x.env.WaitForStatus(x.t, x.ns, rel, rev, "pending-upgrade", 60*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if l, rec := x.lease(rel); l != nil && rec != nil && holderID(l) == rec.Session && rec.Revision == rev {
			return holder{proc: p, session: rec.Session}
		}
		time.Sleep(50 * time.Millisecond)
	}
	x.t.Fatalf("the upgrade of %s never recorded revision %d in its lock\nstderr:\n%s", rel, rev, p.Stderr.String())
	return holder{}
}

// stuckStock leaves rel pending-upgrade at revision 2 the way stock helm
// does when it is killed: no lock record.
func (x *it) stuckStock(rel string) {
	x.t.Helper()
	x.install(true, rel)
	p := x.env.Start(x.t, x.env.Helm4, "upgrade", rel, x.env.Chart("app"), "-n", x.ns, "--wait", "--timeout", "5m", "--set", "nodeSelector.never=matches")
	x.env.WaitForStatus(x.t, x.ns, rel, 2, "pending-upgrade", 60*time.Second)
	p.Kill(x.t)
}

// dead leaves rel pending-upgrade at revision 2 under an expired lock: its
// guarded upgrade is killed and the lock left to expire.
func (x *it) dead(rel string) holder {
	x.t.Helper()
	x.install(false, rel)
	h := x.hold(rel, 2, deadLease)
	h.proc.Kill(x.t)
	x.waitState(rel, inspect.StateExpired, 30*time.Second)
	return h
}

// lockRows runs locks -o json.
func (x *it) lockRows(args ...string) []inspect.Row {
	x.t.Helper()
	res := x.run(0, append([]string{"locks", "-o", "json"}, args...)...)
	var rows []inspect.Row
	if err := json.Unmarshal([]byte(res.Stdout), &rows); err != nil {
		x.t.Fatalf("locks -o json: %v\n%s", err, res.Stdout)
	}
	return rows
}

func (x *it) waitState(rel string, want inspect.State, timeout time.Duration) inspect.Row {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	var last []inspect.Row
	for time.Now().Before(deadline) {
		last = x.lockRows(rel)
		if len(last) == 1 && last[0].State == want {
			return last[0]
		}
		time.Sleep(500 * time.Millisecond)
	}
	x.t.Fatalf("lock of %s/%s never reached state %s within %s: %+v", x.ns, rel, want, timeout, last)
	return inspect.Row{}
}

func (x *it) lease(rel string) (*coordinationv1.Lease, *lock.Record) {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := x.env.Client.CoordinationV1().Leases(x.ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		x.t.Fatalf("reading the lease of %s/%s: %v", x.ns, rel, err)
	}
	rec, _ := lock.DecodeRecord(l.Annotations[lock.AnnotationRecord])
	return l, rec
}

func holderID(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// versions is the resourceVersion of the Lease and of every revision
// Secret of rel: equal before and after means nothing was written.
func (x *it) versions(rel string) string {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	if l, _ := x.lease(rel); l != nil {
		b.WriteString("lease:" + l.ResourceVersion)
	} else {
		b.WriteString("lease:none")
	}
	secrets, err := x.env.Client.CoreV1().Secrets(x.ns).List(ctx, metav1.ListOptions{LabelSelector: helmx.HistorySelector(rel)})
	if err != nil {
		x.t.Fatal(err)
	}
	for _, s := range secrets.Items {
		b.WriteString(" " + s.Name + ":" + s.ResourceVersion)
	}
	return b.String()
}

// latest returns the summary of rel's latest revision.
func (x *it) latest(rel string) helmx.Summary {
	x.t.Helper()
	h := x.env.History(x.t, x.ns, rel)
	if len(h) == 0 {
		x.t.Fatalf("%s/%s has no history", x.ns, rel)
	}
	s, err := helmx.Summarize(&h[len(h)-1].Secret)
	if err != nil {
		x.t.Fatal(err)
	}
	return s
}

// event returns the Event with reason about Secret name, read through the
// core/v1 API that kubectl get events uses.
func (x *it) event(reason, secret string) string {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := x.env.Client.CoreV1().Events(x.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == "Secret" && e.InvolvedObject.Name == secret {
			return e.Message
		}
	}
	x.t.Fatalf("no Event %s about Secret %s in %s; events: %d", reason, secret, x.ns, len(evs.Items))
	return ""
}

func wantContains(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}
