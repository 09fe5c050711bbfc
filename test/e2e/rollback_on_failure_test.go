package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// failingUpgrade is an upgrade whose apply fails at once (the API server
// refuses a negative replica count), so that --rollback-on-failure rolls
// back to revision 1 right away.
var failingUpgrade = []string{"--set", "replicaCount=-1", "--set", "message=v2"}

// TestKilledRollbackOnFailureRecovers (issue 31 item 2): helm's upgrade
// --rollback-on-failure writes the rollback's revision 3 under the lock it
// took for revision 2. Its holder, killed with SIGKILL while revision 3 is
// pending-rollback and after a renewal of its lock, leaves a revision that
// the next operation recovers as soon as the lock has expired, under either
// backend, with --recover-legacy-after at its default and at 0 (never
// recover stock helm's): the upgrade (lock.Held.Previous, what a client
// taking the lock finds) and recover (the lock as read beforehand, as the
// controller reads it). Before, each refused it with exit 5 as stock
// helm's leftover, for 15 minutes, or for good with 0.
func TestKilledRollbackOnFailureRecovers(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	leaseFlag := []string{"--lease-duration", killLease.String()}
	for _, c := range []struct {
		name    string
		backend string
		read    lockReader
		next    []string
		history string
	}{
		{"lease/upgrade", "lease", leaseLock, []string{"upgrade", "REL", chart, "--lock-timeout", "30s", "--set", "message=v3"}, "1:superseded 2:failed 3:failed 4:deployed"},
		{"lease/upgrade/legacy-never", "lease", leaseLock, []string{"upgrade", "REL", chart, "--lock-timeout", "30s", "--set", "message=v3", "--recover-legacy-after", "0"}, "1:superseded 2:failed 3:failed 4:deployed"},
		{"release/upgrade", "release", recordLock, []string{"upgrade", "REL", chart, "--lock-timeout", "30s", "--set", "message=v3"}, "1:superseded 2:failed 3:failed 4:deployed"},
		{"release/upgrade/legacy-never", "release", recordLock, []string{"upgrade", "REL", chart, "--lock-timeout", "30s", "--set", "message=v3", "--recover-legacy-after", "0"}, "1:superseded 2:failed 3:failed 4:deployed"},
		{"lease/recover/legacy-never", "lease", leaseLock, []string{"recover", "REL", "--lock-timeout", "30s", "--recover-legacy-after", "0"}, "1:deployed 2:failed 3:failed"},
		{"release/recover/legacy-never", "release", recordLock, []string{"recover", "REL", "--lock-timeout", "30s", "--recover-legacy-after", "0"}, "1:deployed 2:failed 3:failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "rof"
			backend := []string{"--lock-backend", c.backend}
			// Revision 1's pods never schedule (installed without --wait,
			// it is deployed): the rollback to it waits for ever.
			mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns}, unschedulable, backend)...)

			p := env.Start(t, ha, withRelease(args([]string{"upgrade", "REL", chart, "--rollback-on-failure", "--wait", "--timeout", "5m"}, unschedulable, failingUpgrade, leaseFlag, backend), rel, ns)...)
			env.WaitForStatus(t, ns, rel, 3, "pending-rollback", 60*time.Second)
			holder, rec := c.read(t, env, ns, rel)
			if holder == "" || rec == nil {
				t.Fatalf("no live lock while revision 3 is pending-rollback: holder %q, record %+v\nstderr:\n%s", holder, rec, p.Stderr.String())
			}
			// A renewal after revision 3 was written: the lock's beat
			// changes (it is renewed with either backend).
			waitBeatRenewed(t, env, ns, rel, 30*time.Second)
			killAt := time.Now()
			p.Kill(t)
			t.Logf("killed holder %s while revision 3 was pending-rollback; its stderr:\n%s", holder, p.Stderr.String())

			res := env.Run(t, ha, args(withRelease(c.next, rel, ns), backend)...)
			took := time.Since(killAt)
			if res.ExitCode != 0 {
				t.Fatalf("%s after the kill: exit %d\nstderr:\n%s\nhistory: %v", c.next[0], res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
			}
			figure(t, "kill-to-success rollback-on-failure %s: %s (lease %s)", c.name, secs(took), killLease)
			if !strings.Contains(res.Stderr+res.Stdout, holder) {
				t.Errorf("the recovering %s does not name the killed holder's session %s:\nstdout:\n%s\nstderr:\n%s", c.next[0], holder, res.Stdout, res.Stderr)
			}
			revs := wantHistory(t, env, ns, rel, c.history)
			abandoned(t, revs[2], "pending-rollback", holder)
		})
	}
}

// TestControllerRecoversKilledRollbackOnFailure is
// TestKilledRollbackOnFailureRecovers with the controller as the recoverer,
// with --recover-legacy-after 0: it recovers the rollback's revision once
// the killed holder's lock has expired. Before, it took it for stock helm's
// and never recovered it.
func TestControllerRecoversKilledRollbackOnFailure(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "rofctl"
	mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns}, unschedulable)...)
	p := env.Start(t, ha, withRelease(args([]string{"upgrade", "REL", chart, "--rollback-on-failure", "--wait", "--timeout", "5m", "--lease-duration", killLease.String()}, unschedulable, failingUpgrade), rel, ns)...)
	env.WaitForStatus(t, ns, rel, 3, "pending-rollback", 60*time.Second)
	holder, _ := recordLock(t, env, ns, rel)
	if holder == "" {
		t.Fatalf("no live lock while revision 3 is pending-rollback\nstderr:\n%s", p.Stderr.String())
	}
	waitBeatRenewed(t, env, ns, rel, 30*time.Second)
	startController(t, env, "", "--namespaces", ns, "--leader-elect=false", "--recover-legacy-after", "0")
	killAt := time.Now()
	p.Kill(t)
	got := waitRecovered(t, env, ns, rel, 3, 60*time.Second)
	figure(t, "controller: killed rollback-on-failure (lease %s) recovered %s after the kill", killLease, secs(time.Since(killAt)))
	if !strings.Contains(got.Description, holder) || !strings.Contains(got.Description, "Abandoned pending-rollback") {
		t.Errorf("revision 3's description %q does not name the abandoned pending-rollback of session %s", got.Description, holder)
	}
}

// waitBeatRenewed waits until the lock's beat of rel (the object the
// holder renews, with either backend) is written again from now on.
func waitBeatRenewed(t *testing.T, env *testenv.Env, ns, rel string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	read := func() string {
		b, err := env.Client.CoreV1().Secrets(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the beat of %s/%s: %v", ns, rel, err)
		}
		return b.ResourceVersion
	}
	was := read()
	for read() == was {
		select {
		case <-ctx.Done():
			t.Fatalf("the beat of %s/%s was not renewed within %s", ns, rel, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestSignalDuringRollbackOnFailure (issue 31 item 2, the single-signal
// variant): a first SIGINT makes helm's upgrade --rollback-on-failure give
// up and run its rollback, which helm does not cancel. A chart write of that
// rollback, held on its way to the API server (a proxy in front of it)
// longer than the guard's 3 s grace, lands while the lock is still held:
// the lock is freed only once that write has ended. Before, the guard
// released the lock 3 s after the signal, and the write landed afterwards,
// when another client could hold the release. The release still ends with
// its revisions failed (none pending), and the process exits 130.
func TestSignalDuringRollbackOnFailure(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "rofsig"
	// Held longer than the guard's grace after a first signal (3 s), well
	// inside the write's deadline (the renew deadline: at least two thirds
	// of the 15 s lease after the last renewal, less 1 s).
	const hold = 6 * time.Second
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")

	hp := &holdingProxy{env: env, ns: ns, rel: rel, hold: hold}
	kubeconfig := hp.start(t)
	p := env.Start(t, ha, withRelease(args([]string{
		"upgrade", "REL", chart, "--rollback-on-failure", "--wait", "--timeout", "5m", "--set", "message=v2",
		"--lock-backend", "lease", "--lease-duration", "15s", "--kubeconfig", kubeconfig,
	}, unschedulable), rel, ns)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriter(t, env, ns, rel, 2, 10*time.Second)
	hp.arm(holder.Session)
	p.Signal(t, syscall.SIGINT)

	code := p.Wait(t, 60*time.Second)
	t.Logf("stderr:\n%s", p.Stderr.String())
	got := hp.result(t, 30*time.Second)
	figure(t, "signal during rollback-on-failure: held %s %s answered %d after %s; lock then %s; exit %d",
		got.method, got.path, got.code, hold, got.lock, code)
	if got.err != nil {
		t.Fatalf("the held write: %v", got.err)
	}
	if got.code/100 != 2 {
		t.Errorf("the held write was answered %d; want it accepted (it was sent before the lock was given back)", got.code)
	}
	if !got.held {
		t.Errorf("the rollback's chart write %s %s landed after the lock was given back (lock: %s)", got.method, got.path, got.lock)
	}
	if code != exitcode.Interrupted {
		t.Errorf("exit code %d after SIGINT; want %d", code, exitcode.Interrupted)
	}
	waitLockFree(t, env, ns, rel, 10*time.Second)
	for _, r := range revisions(t, env, ns, rel) {
		if strings.HasPrefix(string(r.Status), "pending") {
			t.Errorf("revision %d is still %s after the interrupted upgrade\n%s", r.Revision, r.Status, describe(revisions(t, env, ns, rel)))
		}
	}
}

// holdingProxy sits between the tested binary and the API server. Once
// armed, it holds the first write of a chart object (not a release record,
// the lock's beat, a Lease or an Event) for hold, sends it on as the API
// server would go on with a request it received even when its client is
// gone, and, before it answers, reads whether session still holds the
// release's lock (its Lease and the lock on its newest record).
type holdingProxy struct {
	env     *testenv.Env
	ns, rel string
	hold    time.Duration

	mu      sync.Mutex
	session string
	taken   bool
	done    chan heldWrite
}

// heldWrite is what became of the held write.
type heldWrite struct {
	method, path string
	code         int
	held         bool   // the lock was still the session's when the write had landed
	lock         string // what the lock was then
	err          error
}

func (hp *holdingProxy) start(t *testing.T) (kubeconfig string) {
	t.Helper()
	hp.done = make(chan heldWrite, 1)
	srv, err := testenv.NewProxy(hp.env.Config, hp.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: srv.URL}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	cfg.CurrentContext = "proxy"
	path := filepath.Join(t.TempDir(), "kubeconfig-proxy")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func (hp *holdingProxy) arm(session string) {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	hp.session = session
}

// chartWrite reports whether r writes an object of the chart.
func chartWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return false
	}
	for _, not := range []string{"/secrets", "/leases", "/events"} {
		if strings.Contains(r.URL.Path, not) {
			return false
		}
	}
	return true
}

func (hp *holdingProxy) handle(w http.ResponseWriter, r *http.Request, forward http.Handler) {
	hp.mu.Lock()
	take := hp.session != "" && !hp.taken && chartWrite(r)
	if take {
		hp.taken = true
	}
	session := hp.session
	hp.mu.Unlock()
	if !take {
		forward.ServeHTTP(w, r)
		return
	}
	time.Sleep(hp.hold)
	// The write goes on whether its client is still waiting or not.
	rec := httptest.NewRecorder()
	forward.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
	out := heldWrite{method: r.Method, path: r.URL.Path, code: rec.Code}
	out.held, out.lock, out.err = hp.holds(session)
	hp.done <- out
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// holds reports whether session holds the release's lock: its Lease and
// the lock on its newest record name it, unreleased.
func (hp *holdingProxy) holds(session string) (bool, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := hp.env.Client.CoordinationV1().Leases(hp.ns).Get(ctx, lock.LeaseName(hp.rel), metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("reading the Lease: %w", err)
	}
	leaseHolder := ""
	if l.Spec.HolderIdentity != nil {
		leaseHolder = *l.Spec.HolderIdentity
	}
	list, err := hp.env.Client.CoreV1().Secrets(hp.ns).List(ctx, metav1.ListOptions{LabelSelector: helmx.HistorySelector(hp.rel)})
	if err != nil {
		return false, "", fmt.Errorf("reading the records: %w", err)
	}
	var newest *corev1.Secret
	for i := range list.Items {
		if newest == nil || revOf(&list.Items[i]) > revOf(newest) {
			newest = &list.Items[i]
		}
	}
	if newest == nil {
		return false, "", errors.New("no record")
	}
	rec, err := lock.DecodeRecord(newest.Annotations[lock.AnnotationRecord])
	if err != nil || rec == nil {
		return false, "", fmt.Errorf("the lock on %s: %w", newest.Name, err)
	}
	desc := fmt.Sprintf("Lease holder %q; %s: session %s, released at %v", leaseHolder, newest.Name, rec.Session, rec.ReleasedAt)
	return leaseHolder == session && rec.Session == session && rec.ReleasedAt.IsZero(), desc, nil
}

// result waits for what became of the held write.
func (hp *holdingProxy) result(t *testing.T, timeout time.Duration) heldWrite {
	t.Helper()
	select {
	case got := <-hp.done:
		return got
	case <-time.After(timeout):
		t.Fatalf("no chart write was held within %s of the signal", timeout)
		return heldWrite{}
	}
}
