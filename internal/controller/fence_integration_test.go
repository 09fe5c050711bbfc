package controller

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// writeGate is a proxy in front of the real API server for the
// controller's clients. It holds the first write to a chart object (a
// ConfigMap or Deployment) of release rel, not a dry run, as the API server's priority
// and fairness queues or a slow admission webhook do, after the server
// set the request's deadline from its timeout parameter; from then on
// every other write for rel (its lock's renewals) is answered 503, so the
// controller's lock on rel runs out. A held write is forwarded once the
// test releases it, under that deadline and its client's connection: what
// its client gave up on is not written.
type writeGate struct {
	rel     string
	cfg     *rest.Config
	arrived chan string
	givenUp chan struct{}
	release chan struct{}

	mu          sync.Mutex
	holding     bool
	once        sync.Once
	givenUpOnce sync.Once
	inFlight    sync.WaitGroup
}

var chartObject = regexp.MustCompile(`/namespaces/[^/]+/(configmaps|deployments)/`)

func newWriteGate(t *testing.T, env *testenv.Env, rel string) *writeGate {
	t.Helper()
	g := &writeGate{rel: rel, arrived: make(chan string, 1), givenUp: make(chan struct{}), release: make(chan struct{})}
	g.cfg = env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if r.Method == http.MethodGet || !strings.Contains(r.URL.Path, rel) {
			forward.ServeHTTP(w, r)
			return
		}
		g.mu.Lock()
		// Dry runs write nothing: the first write that would is held.
		hold := !g.holding && chartObject.MatchString(r.URL.Path) && !r.URL.Query().Has("dryRun")
		refuse := g.holding
		g.holding = g.holding || hold
		g.mu.Unlock()
		switch {
		case refuse:
			http.Error(w, "refused by the test's proxy: the lock's renewals must fail", http.StatusServiceUnavailable)
			return
		case hold:
			g.inFlight.Add(1)
			defer g.inFlight.Done()
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			ctx := r.Context()
			if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			go func() {
				<-ctx.Done()
				g.givenUpOnce.Do(func() { close(g.givenUp) })
			}()
			g.arrived <- r.Method + " " + r.URL.Path
			<-g.release
			r = r.WithContext(ctx)
		}
		forward.ServeHTTP(w, r)
	})
	t.Cleanup(g.Release)
	return g
}

// Release lets the held write (and every later one) through.
func (g *writeGate) Release() { g.once.Do(func() { close(g.release) }) }

// releaseOnceGivenUp lets the held write through once its client gave it
// up (the fence's deadline), or, failing the test, after within: a write
// nobody bounded then lands, as it would in the API server's queue.
func (g *writeGate) releaseOnceGivenUp(t *testing.T, within time.Duration, what string) {
	t.Helper()
	select {
	case <-g.givenUp:
	case <-time.After(within):
		t.Errorf("the controller's write to %s held in flight was not given up within %s of %s; letting it through", g.rel, within, what)
	}
	g.Release()
	g.inFlight.Wait()
}

// rig is a namespace of the real cluster, the helm-autorecover binary and
// a Reconciler whose clients go through a writeGate.
type rig struct {
	t    *testing.T
	env  *testenv.Env
	ns   string
	bin  string
	gate *writeGate
	r    *Reconciler
}

func newRig(t *testing.T, gated string, opts Options) *rig {
	t.Helper()
	env := testenv.Get(t)
	x := &rig{t: t, env: env, ns: env.Namespace(t), bin: env.Bin(t)}
	x.gate = newWriteGate(t, env, gated)
	conn, err := connect(x.gate.cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	opts.LockBackend, opts.Who = protocol.BackendAuto, "controller@test"
	opts.Policy.Autorecover, opts.Policy.LegacyAfter, opts.Policy.Hints = true, time.Hour, recovery.CLIHints
	x.r = &Reconciler{Conn: conn, Cache: pendingCache(x.ns, "alpha", "bravo"), Options: opts, metrics: newMetrics(prometheus.NewRegistry()), kind: "Secret"}
	return x
}

// abandon installs rel, then SIGKILLs a guarded upgrade of it (lease 3 s)
// once it wrote revision 2 pending and applied what it changes: the
// Deployment's nodeSelector no node matches (which holds it in --wait),
// ConfigMap REL-config's message, and ConfigMap REL-extra, which only it
// renders.
func (x *rig) abandon(rel string) {
	x.t.Helper()
	ctx := context.Background()
	chart := x.env.Chart("app")
	if res := x.env.Run(x.t, x.bin, "install", rel, chart, "-n", x.ns, "--wait", "--timeout", "60s"); res.ExitCode != 0 {
		x.t.Fatalf("install %s: exit %d: %s", rel, res.ExitCode, res.Stderr)
	}
	p := x.env.Start(x.t, x.bin, "upgrade", rel, chart, "-n", x.ns, "--wait", "--timeout", "5m", "--lease-duration", "3s",
		"--set", "nodeSelector.never=matches", "--set", "extraConfigMap=true", "--set", "message=abandoned")
	x.env.WaitForStatus(x.t, x.ns, rel, 2, "pending-upgrade", 2*time.Minute)
	x.waitFor(time.Minute, "the upgrade of "+rel+" to apply its changes", func() (bool, string) {
		d, err := x.env.Client.AppsV1().Deployments(x.ns).Get(ctx, rel, metav1.GetOptions{})
		if err != nil || d.Spec.Template.Spec.NodeSelector["never"] != "matches" {
			return false, fmt.Sprintf("Deployment: %v", err)
		}
		if _, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-extra", metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-config", metav1.GetOptions{})
		return err == nil && cm.Data["message"] == "abandoned", fmt.Sprintf("config: %v", err)
	})
	p.Kill(x.t)
}

func (x *rig) waitFor(timeout time.Duration, what string, cond func() (bool, string)) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reconcile judges rel once its dead holder's lock has expired as the
// controller sees it (confirmed on its own clock), in the background; the
// channel is closed when that reconcile has returned.
func (x *rig) reconcile(rel string) <-chan struct{} {
	x.t.Helper()
	ctx := context.Background()
	x.waitFor(time.Minute, "the lock of "+rel+" to expire", func() (bool, string) {
		_, stores, err := x.r.Conn.Stores(ctx, x.ns, x.r.Options.LockBackend)
		if err != nil {
			return false, err.Error()
		}
		st, err := x.r.Conn.Inspect(ctx, x.ns, rel, stores)
		if err != nil {
			return false, err.Error()
		}
		return st.State == lock.Expired && !st.Confirming, fmt.Sprintf("state %s, confirming %t", st.State, st.Confirming)
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := x.r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: x.ns, Name: rel}})
		x.t.Logf("reconcile %s: %+v, %v", rel, res, err)
	}()
	return done
}

// pendingCache stands for the controller's cache holding a pending record
// of each release.
func pendingCache(ns string, rels ...string) metaCache {
	var c metaCache
	for _, rel := range rels {
		c.items = append(c.items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
			Name: helmx.ReleaseSecretName(rel, 2), Namespace: ns, Labels: map[string]string{helmx.LabelName: rel},
		}})
	}
	return c
}

// versions are the resourceVersions of rel's chart objects ("gone" for one
// that does not exist).
func (x *rig) versions(rel string) map[string]string {
	x.t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	note := func(what string, m metav1.Object, err error) {
		switch {
		case apierrors.IsNotFound(err):
			out[what] = "gone"
		case err != nil:
			x.t.Fatalf("reading %s: %v", what, err)
		default:
			out[what] = m.GetResourceVersion()
		}
	}
	d, err := x.env.Client.AppsV1().Deployments(x.ns).Get(ctx, rel, metav1.GetOptions{})
	note("Deployment "+rel, d, err)
	for _, name := range []string{rel + "-config", rel + "-extra"} {
		cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, name, metav1.GetOptions{})
		note("ConfigMap "+name, cm, err)
	}
	return out
}

func (x *rig) wantUnchanged(rel string, before map[string]string, since string) {
	x.t.Helper()
	if after := x.versions(rel); fmt.Sprint(after) != fmt.Sprint(before) {
		x.t.Errorf("the controller wrote %s's objects after %s: resourceVersions %v, then %v", rel, since, before, after)
	}
}

func awaitDone(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not return within 2 minutes", what)
	}
}

// TestIntegrationControllerWritesNothingAfterItsLockIsLost (issue 31, item
// 5): the controller recovers a release; its write to undo what the
// abandoned revision applied is held up on its way, and its lock cannot be
// renewed meanwhile, so it runs out and another client takes the release
// over and upgrades it. The controller's write, bounded by its lock's renew
// deadline through the release's fence, never lands: the objects stay as
// the client that took over left them.
func TestIntegrationControllerWritesNothingAfterItsLockIsLost(t *testing.T) {
	x := newRig(t, "bravo", Options{Policy: recovery.Policy{Strategy: recovery.StrategyFail}})
	x.abandon("bravo")
	done := x.reconcile("bravo")
	select {
	case w := <-x.gate.arrived:
		t.Logf("held the controller's %s", w)
	case <-done:
		t.Fatal("the controller's recovery ended without writing bravo's objects")
	case <-time.After(time.Minute):
		t.Fatal("no write of the controller's to bravo's objects within a minute")
	}

	// The controller's lock runs out; another client takes bravo over.
	res := x.env.Run(t, x.bin, "upgrade", "bravo", x.env.Chart("app"), "-n", x.ns, "--set", "message=taker", "--lock-timeout", "2m")
	if res.ExitCode != 0 {
		t.Fatalf("the upgrade of the client that took over: exit %d: %s", res.ExitCode, res.Stderr)
	}
	taken := x.versions("bravo")
	x.gate.releaseOnceGivenUp(t, 5*time.Second, "the takeover")
	awaitDone(t, done, "the controller's recovery of bravo")
	x.wantUnchanged("bravo", taken, "another client took it over")
	if got := strings.Join(x.env.Summary(t, x.ns, "bravo"), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("bravo's history = %s, want 1:superseded 2:failed 3:deployed", got)
	}
	if cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(t.Context(), "bravo-config", metav1.GetOptions{}); err != nil || cm.Data["message"] != "taker" {
		t.Errorf("bravo-config: %v, %v; want the message of the client that took over", cm.Data, err)
	}
}

// TestIntegrationControllerFencePerRelease (issue 31, item 5): while the
// controller rolls release alpha back (--recover-strategy=rollback) under
// alpha's lock, its recovery of bravo is judged by bravo's own lock: the
// write to bravo held up on its way is cut off at bravo's renew deadline
// (its renewals fail) and never lands; and alpha's rollback, going on
// after that, is judged by alpha's lock alone, which is still held: it
// succeeds.
func TestIntegrationControllerFencePerRelease(t *testing.T) {
	rollingBack := make(chan string, 2)
	proceed := make(chan struct{})
	var kubeconfig string
	x := newRig(t, "bravo", Options{
		Policy: recovery.Policy{Strategy: recovery.StrategyRollback},
		Rollback: func(ctx context.Context, held *protocol.Lock, rel string, revision int) error {
			rollingBack <- rel
			<-proceed
			return helmRollback(ctx, held, kubeconfigGetter(kubeconfig), rel, revision)
		},
	})
	kubeconfig = x.env.Kubeconfig
	x.abandon("alpha")
	x.abandon("bravo")

	alphaDone := x.reconcile("alpha")
	select {
	case rel := <-rollingBack:
		if rel != "alpha" {
			t.Fatalf("rolling back %s, want alpha", rel)
		}
	case <-alphaDone:
		t.Fatal("the controller's recovery of alpha ended before rolling back")
	case <-time.After(time.Minute):
		t.Fatal("alpha not rolled back within a minute")
	}
	bravoDone := x.reconcile("bravo")
	select {
	case w := <-x.gate.arrived:
		t.Logf("held the controller's %s while alpha rolls back", w)
	case <-bravoDone:
		t.Fatal("the controller's recovery of bravo ended without writing bravo's objects")
	case <-time.After(time.Minute):
		t.Fatal("no write of the controller's to bravo's objects within a minute")
	}
	held := x.versions("bravo")
	// bravo's lock renew deadline is at most its lease (15 s) away.
	x.gate.releaseOnceGivenUp(t, 40*time.Second, "bravo's lock running out")
	awaitDone(t, bravoDone, "the controller's recovery of bravo")
	x.wantUnchanged("bravo", held, "its lock ran out")

	close(proceed)
	awaitDone(t, alphaDone, "the controller's recovery of alpha")
	if got := strings.Join(x.env.Summary(t, x.ns, "alpha"), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("alpha's history after its rollback = %s, want 1:superseded 2:failed 3:deployed", got)
	}
	rev3 := x.env.History(t, x.ns, "alpha")
	if n := len(rev3); n == 3 {
		if rec, err := lock.DecodeRecord(rev3[2].Secret.Annotations[lock.AnnotationRecord]); err != nil || rec == nil || rec.Revision != 3 {
			t.Errorf("alpha's revision 3, written by helm's rollback, carries lock record %+v (%v); want the controller's lock, through alpha's fence", rec, err)
		}
	}
}

// kubeconfigGetter is a REST client getter for the kubeconfig at path.
func kubeconfigGetter(path string) genericclioptions.RESTClientGetter {
	f := genericclioptions.NewConfigFlags(false)
	f.KubeConfig = &path
	return f
}

// helmRollback rolls rel in ns back to revision with helm's own action on
// getter's clients, as the CLI's controller does.
func helmRollback(ctx context.Context, held *protocol.Lock, getter genericclioptions.RESTClientGetter, rel string, revision int) error {
	cfg, err := held.HelmConfig(ctx, held.Fence().Getter(getter))
	if err != nil {
		return err
	}
	rb := action.NewRollback(cfg)
	rb.Version = revision
	rb.Timeout = time.Minute
	rb.WaitStrategy = kube.HookOnlyStrategy
	return rb.Run(rel)
}
