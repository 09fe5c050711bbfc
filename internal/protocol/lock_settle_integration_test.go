package protocol

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// settleProxy sits in front of the real API server: fault answers a request
// itself when it returns true; every request is counted by seen.
func settleProxy(t *testing.T, env *testenv.Env, fault func(http.ResponseWriter, *http.Request) bool, seen func(*http.Request)) *rest.Config {
	t.Helper()
	return env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if seen != nil {
			seen(r)
		}
		if fault == nil || !fault(w, r) {
			forward.ServeHTTP(w, r)
		}
	})
}

// failPut answers every PUT of record name that match accepts (nil: all)
// with 403 (an admission webhook's refusal, say: a failure the fence does
// not send again, as it does a 5xx), counting them in hits.
func failPut(name string, match func(*http.Request) bool, hits *atomic.Int32) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPut || !strings.HasSuffix(r.URL.Path, "/"+name) || (match != nil && !match(r)) {
			return false
		}
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by the test","reason":"Forbidden","code":403}`)
		return true
	}
}

func settleRelease(ns string, rev int, st common.Status) *rspb.Release {
	return &rspb.Release{
		Name: "web", Namespace: ns, Version: rev,
		Info:  &rspb.Info{Status: st, Description: "test"},
		Chart: &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: "app", Version: "0.1.0"}},
	}
}

func settleConn(t *testing.T, cfg *rest.Config) *Conn {
	t.Helper()
	c, err := Connect(cfg, clock.RealClock{}, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func settleAcquire(t *testing.T, c *Conn, ns string) *Lock {
	t.Helper()
	ctx := context.Background()
	l, err := c.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: 15 * time.Second, Backend: BackendRelease})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var settlePolicy = recovery.Policy{Autorecover: true, LegacyAfter: 15 * time.Minute}

// upgradeWithFailedFinalWrite runs the storage writes of helm's upgrade of
// release "web" from revision 1 to 2 under l, through a fence whose helm
// client reaches the API server through helmCfg: create revision 2
// pending-upgrade, supersede revision 1, write revision 2 deployed. It
// returns the error of that last write, which helm's upgrade only logs.
func upgradeWithFailedFinalWrite(t *testing.T, l *Lock, ns string, helmCfg *rest.Config) error {
	t.Helper()
	ctx := context.Background()
	if out, err := l.Recover(ctx, Procedure{Policy: settlePolicy, Next: lock.OpUpgrade}); err != nil || out.Decision.Verdict != recovery.Proceed {
		t.Fatalf("recovery before the upgrade: %v, %v", out.Decision.Verdict, err)
	}
	if err := l.SetRevision(ctx, 2); err != nil {
		t.Fatal(err)
	}
	w := &helmx.WriteFence{}
	stop := w.Guard(helmx.GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: l})
	defer stop()
	cs, err := kubernetes.NewForConfig(w.Wrap(helmCfg))
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	if err := d.Create(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusPendingUpgrade)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(helmx.ReleaseSecretName("web", 1), settleRelease(ns, 1, common.StatusSuperseded)); err != nil {
		t.Fatal(err)
	}
	return d.Update(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusDeployed))
}

func settleInstall(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := plain.Create(helmx.ReleaseSecretName("web", 1), settleRelease(ns, 1, common.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
}

// nextUpgradeProceeds: the next client takes the lock and its recovery
// does not leave the release blocked (the guard's exit 5); it returns the
// verdict.
func nextUpgradeProceeds(t *testing.T, c *Conn, ns string) recovery.Verdict {
	t.Helper()
	ctx := context.Background()
	l := settleAcquire(t, c, ns)
	defer func() { _ = l.Release(ctx) }()
	out, err := l.Recover(ctx, Procedure{Policy: settlePolicy, Next: lock.OpUpgrade})
	if err != nil {
		t.Fatalf("the next client's recovery: %v", err)
	}
	if out.Decision.Verdict == recovery.Blocked {
		t.Fatalf("the next client is blocked (exit 5): %s", out.Decision.Reason)
	}
	return out.Decision.Verdict
}

// TestIntegrationReleaseMarksOwnPendingRevisionFailed: helm's final write
// of its own revision answered 403 (helm logs it and reports success); the
// holder's release marks the revision failed, naming its session, and the
// next upgrade proceeds instead of taking the revision for stock helm's.
func TestIntegrationReleaseMarksOwnPendingRevisionFailed(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns)
	ctx := context.Background()
	c := settleConn(t, env.Config)
	l := settleAcquire(t, c, ns)
	var hits atomic.Int32
	helmCfg := settleProxy(t, env, failPut(helmx.ReleaseSecretName("web", 2), nil, &hits), nil)
	if err := upgradeWithFailedFinalWrite(t, l, ns, helmCfg); err == nil || hits.Load() == 0 {
		t.Fatalf("helm's final write: %v; want it answered 403", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	hist, err := c.History(ctx, ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	v2 := hist[len(hist)-1]
	if v2.Revision != 2 || v2.Status != common.StatusFailed || !strings.Contains(v2.Description, l.Session()) {
		t.Fatalf("revision %d after release: %s %q; want 2 failed, naming session %s", v2.Revision, v2.Status, v2.Description, l.Session())
	}
	if v := nextUpgradeProceeds(t, settleConn(t, env.Config), ns); v != recovery.Proceed {
		t.Errorf("the next client's verdict: %v; want Proceed", v)
	}
}

// TestIntegrationReleaseHandsOnOwnPendingRevision: when the holder cannot
// mark its own revision failed either, its release names itself as the
// abandoned holder, so the next client recovers the revision at once.
func TestIntegrationReleaseHandsOnOwnPendingRevision(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns)
	ctx := context.Background()
	var helmHits, markHits atomic.Int32
	// The lock's connection cannot mark the revision failed: recovery's
	// write (field manager helm-autorecover) is answered 403.
	c := settleConn(t, settleProxy(t, env, failPut(helmx.ReleaseSecretName("web", 2), func(r *http.Request) bool {
		return r.URL.Query().Get("fieldManager") == recovery.FieldManager
	}, &markHits), nil))
	l := settleAcquire(t, c, ns)
	helmCfg := settleProxy(t, env, failPut(helmx.ReleaseSecretName("web", 2), nil, &helmHits), nil)
	if err := upgradeWithFailedFinalWrite(t, l, ns, helmCfg); err == nil {
		t.Fatal("helm's final write succeeded; want it answered 403")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if markHits.Load() == 0 {
		t.Fatal("the holder never tried to mark its revision failed")
	}
	direct := settleConn(t, env.Config)
	hist, err := direct.History(ctx, ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	if v2 := hist[len(hist)-1]; v2.Revision != 2 || v2.Status != common.StatusPendingUpgrade {
		t.Fatalf("revision %d after release: %s; want 2 still pending-upgrade", v2.Revision, v2.Status)
	}
	next := settleAcquire(t, direct, ns)
	prev := next.Previous()
	_ = next.Release(ctx)
	if prev.State != recovery.LockExpired || prev.Session != l.Session() || prev.Revision != 2 {
		t.Fatalf("the next client found %+v; want session %s, expired, revision 2 (named abandoned)", prev, l.Session())
	}
	if v := nextUpgradeProceeds(t, direct, ns); v != recovery.Recover {
		t.Errorf("the next client's verdict: %v; want Recover", v)
	}
	hist, err = direct.History(ctx, ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	if v2 := hist[len(hist)-1]; v2.Status != common.StatusFailed {
		t.Errorf("revision 2 after the next client: %s; want failed", v2.Status)
	}
}

// TestIntegrationReleaseHappyPathResolvesNothing: when every write of
// helm's own revision succeeded, nothing is left for the release to
// resolve (settleOwn then makes no request), and it writes no status.
func TestIntegrationReleaseHappyPathResolvesNothing(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns)
	ctx := context.Background()
	var marks atomic.Int32
	c := settleConn(t, settleProxy(t, env, nil, func(r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Get("fieldManager") == recovery.FieldManager {
			marks.Add(1)
		}
	}))
	l := settleAcquire(t, c, ns)
	var none atomic.Int32
	if err := upgradeWithFailedFinalWrite(t, l, ns, settleProxy(t, env, failPut("no-such-record", nil, &none), nil)); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	left := len(l.unsettled)
	l.mu.Unlock()
	if left != 0 {
		t.Errorf("after helm's writes all succeeded, %d revisions are left to resolve; want none", left)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := marks.Load(); n != 0 {
		t.Errorf("release marked a revision %d times; want never", n)
	}
}

// TestIntegrationGuardedUpgradeResolvesOwnFailedFinalWrite: the CLI's
// upgrade, whose final write of its revision is answered 403 once (helm
// fails, or in some paths only logs it, and leaves the revision
// pending-upgrade), leaves that revision failed, naming its session,
// instead of pending under a released lock; the next guarded upgrade then
// runs (exit 0), where it used to take the revision for stock helm's and
// refuse with exit 5.
func TestIntegrationGuardedUpgradeResolvesOwnFailedFinalWrite(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	bin := env.Bin(t)
	chartDir := env.Chart("app")
	if res := env.Run(t, bin, "upgrade", "--install", "web", chartDir, "-n", ns); res.ExitCode != 0 {
		t.Fatalf("install: exit %d\n%s", res.ExitCode, res.Stderr)
	}
	var hits atomic.Int32
	final := helmx.ReleaseSecretName("web", 2)
	cfg := settleProxy(t, env, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPut || !strings.HasSuffix(r.URL.Path, "/secrets/"+final) || hits.Load() > 0 {
			return false
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return false
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if !strings.Contains(string(body), `"status":"deployed"`) {
			return false
		}
		hits.Add(1)
		return failPut(final, nil, new(atomic.Int32))(w, r)
	}, nil)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: cfg.Host}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy", Namespace: ns}
	kc.CurrentContext = "proxy"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	res := env.RunEnv(t, []string{"KUBECONFIG=" + path}, bin, "upgrade", "web", chartDir, "-n", ns, "--set", "message=v2")
	if hits.Load() == 0 {
		t.Fatalf("helm's final write of revision 2 never came (exit %d)\n%s", res.ExitCode, res.Stderr)
	}
	t.Logf("upgrade whose final write failed: exit %d\n%s", res.ExitCode, res.Stderr)
	hist := env.History(t, ns, "web")
	v2 := hist[len(hist)-1]
	if v2.Version != 2 || v2.Status != string(common.StatusFailed) {
		t.Fatalf("revision %d after the upgrade is %s; want 2 failed", v2.Version, v2.Status)
	}
	s, err := helmx.Summarize(&v2.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Description, "marked failed by its own holder") {
		t.Errorf("revision 2's description: %q; want it to say its own holder marked it failed", s.Description)
	}
	if want := "helm's operation left revision 2 pending-upgrade (its final write did not land); it was marked failed"; !strings.Contains(res.Stderr, want) {
		t.Errorf("the upgrade's stderr does not say %q:\n%s", want, res.Stderr)
	}
	if res := env.Run(t, bin, "upgrade", "web", chartDir, "-n", ns, "--set", "message=v3"); res.ExitCode != 0 {
		t.Fatalf("the next upgrade: exit %d (5: taken for stock helm's pending revision)\n%s", res.ExitCode, res.Stderr)
	}
	if hist := env.History(t, ns, "web"); hist[len(hist)-1].Version != 3 || hist[len(hist)-1].Status != string(common.StatusDeployed) {
		t.Errorf("after the next upgrade: revision %d %s; want 3 deployed", hist[len(hist)-1].Version, hist[len(hist)-1].Status)
	}
}
