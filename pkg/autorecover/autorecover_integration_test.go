package autorecover_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

func TestMain(m *testing.M) {
	// The releases here are also upgraded with the stock helm binary, which
	// applies as field manager "helm"; the SDK must use the same name (see
	// the package documentation).
	kube.ManagedFieldsManager = "helm"
	testenv.Main(m)
}

const releaseName = "web"

// generous bounds what waiting for a condition may take on a loaded
// machine; no test asserts how long anything took.
const generous = 2 * time.Minute

func newClient(t *testing.T, cfg *rest.Config, opts ...autorecover.Option) *autorecover.Client {
	t.Helper()
	c, err := autorecover.NewClient(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func getter(env *testenv.Env, ns string) *genericclioptions.ConfigFlags {
	g := genericclioptions.NewConfigFlags(false)
	g.KubeConfig = &env.Kubeconfig
	g.Namespace = &ns
	return g
}

// actionConfig is a plain helm configuration for ns, with no fence.
func actionConfig(t *testing.T, env *testenv.Env, ns string) *action.Configuration {
	t.Helper()
	cfg := action.NewConfiguration()
	if err := cfg.Init(getter(env, ns), ns, "secret"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func appChart(t *testing.T, env *testenv.Env) *chart.Chart {
	t.Helper()
	c, err := loader.Load(env.Chart("app"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installStock installs revision 1 with the upstream helm v4 binary.
func installStock(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	if r := env.Run(t, env.Helm4, "install", releaseName, env.Chart("app"), "-n", ns); r.ExitCode != 0 {
		t.Fatalf("stock helm install: %s", r.Stderr)
	}
}

func newUpgrade(cfg *action.Configuration, ns string, timeout time.Duration) *action.Upgrade {
	up := action.NewUpgrade(cfg)
	up.Namespace = ns
	up.WaitStrategy = kube.StatusWatcherStrategy
	up.Timeout = timeout
	return up
}

// neverReady makes the Deployment's pods unschedulable, so that an upgrade
// waiting for them stays pending until its context or timeout ends.
var neverReady = map[string]any{"nodeSelector": map[string]any{"no-such-node": "true"}}

func recordKey(rev int) string { return "sh.helm.release.v1." + releaseName + ".v" + strconv.Itoa(rev) }

// snapshot maps each revision Secret of the release, and the lock's Lease
// when there is one, to its resourceVersion: any write to them changes it.
func snapshot(t *testing.T, env *testenv.Env, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range env.History(t, ns, releaseName) {
		out[r.Secret.Name] = r.Secret.ResourceVersion
	}
	if rv, ok := leaseVersion(t, env, ns); ok {
		out["lease/"+lock.LeaseName(releaseName)] = rv
	}
	return out
}

// leaseVersion returns the resourceVersion of the release's lock Lease, and
// false when there is none.
func leaseVersion(t *testing.T, env *testenv.Env, ns string) (string, bool) {
	t.Helper()
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), lock.LeaseName(releaseName), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return l.ResourceVersion, true
}

func summary(t *testing.T, env *testenv.Env, ns string) string {
	t.Helper()
	return strings.Join(env.Summary(t, ns, releaseName), " ")
}

func stockHistory(t *testing.T, env *testenv.Env, ns string) []map[string]any {
	t.Helper()
	r := env.Run(t, env.Helm4, "history", releaseName, "-n", ns, "-o", "json")
	if r.ExitCode != 0 {
		t.Fatalf("stock helm history: %s", r.Stderr)
	}
	var h []map[string]any
	if err := json.Unmarshal([]byte(r.Stdout), &h); err != nil {
		t.Fatalf("stock helm history output: %v\n%s", err, r.Stdout)
	}
	return h
}

// readRecord reads revision rev of the release with stock helm's driver.
func readRecord(t *testing.T, env *testenv.Env, ns string, rev int) *rspb.Release {
	t.Helper()
	got, err := driver.NewSecrets(env.Client.CoreV1().Secrets(ns)).Get(recordKey(rev))
	if err != nil {
		t.Fatal(err)
	}
	return got.(*rspb.Release)
}

// createStockPending writes revision 2 pending-upgrade with stock helm's
// driver, which knows nothing of locks: what a killed `helm upgrade` leaves.
func createStockPending(t *testing.T, env *testenv.Env, ns string) {
	t.Helper()
	r := readRecord(t, env, ns, 1)
	r.Version, r.Info.Status, r.Info.Description = 2, common.StatusPendingUpgrade, "Preparing upgrade"
	if err := driver.NewSecrets(env.Client.CoreV1().Secrets(ns)).Create(recordKey(2), r); err != nil {
		t.Fatal(err)
	}
}

// createPendingUnder writes revision 2 pending-upgrade as lk's holder does:
// through storage fenced by lk, so that the record carries lk's lock.
func createPendingUnder(t *testing.T, env *testenv.Env, ns string, lk *autorecover.Lock) {
	t.Helper()
	r := readRecord(t, env, ns, 1)
	r.Version, r.Info.Status, r.Info.Description = 2, common.StatusPendingUpgrade, "Preparing upgrade"
	cfg := actionConfig(t, env, ns)
	if err := autorecover.FencedStorage(cfg, lk); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Releases.Create(r); err != nil {
		t.Fatal(err)
	}
}

// nodeSelector returns the Deployment's pod nodeSelector.
func nodeSelector(t *testing.T, env *testenv.Env, ns string) map[string]string {
	t.Helper()
	d, err := env.Client.AppsV1().Deployments(ns).Get(context.Background(), releaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec.NodeSelector
}

// releaseAtEnd gives the lock back when the test ends.
func releaseAtEnd(t *testing.T, lk *autorecover.Lock) {
	t.Cleanup(func() {
		if err := lk.Release(context.Background()); err != nil {
			t.Errorf("releasing the lock: %v", err)
		}
	})
}

// storageWrite is one write helm made through its storage driver.
type storageWrite struct {
	op, key string
	err     error
}

// recordingDriver passes every call to the driver it wraps and records the
// writes helm attempted, with their outcome.
type recordingDriver struct {
	driver.Driver
	mu     sync.Mutex
	writes []storageWrite
}

func (d *recordingDriver) record(op, key string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes = append(d.writes, storageWrite{op, key, err})
}

func (d *recordingDriver) Create(key string, rls release.Releaser) error {
	err := d.Driver.Create(key, rls)
	d.record("create", key, err)
	return err
}

func (d *recordingDriver) Update(key string, rls release.Releaser) error {
	err := d.Driver.Update(key, rls)
	d.record("update", key, err)
	return err
}

func (d *recordingDriver) Delete(key string) (release.Releaser, error) {
	r, err := d.Driver.Delete(key)
	d.record("delete", key, err)
	return r, err
}

func (d *recordingDriver) Writes() []storageWrite {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.writes)
}

// recordWrites makes cfg's release storage record helm's writes.
func recordWrites(cfg *action.Configuration) *recordingDriver {
	d := &recordingDriver{Driver: cfg.Releases.Driver}
	cfg.Releases.Driver = d
	return d
}

// pausableClock is the real clock until Freeze: from then on its Now stands
// still (timers keep running), until Resume. A lock taken with it believes
// no time passes while frozen, so its Valid keeps saying yes: the limit of
// a process paused between its check of the lock and the write that
// follows, which fencing does not cover by itself (see the package
// documentation, "What fencing does not cover").
type pausableClock struct {
	clock.RealClock
	mu     sync.Mutex
	frozen time.Time
	// skipped is added to the real time: Skip(d) is what a process
	// suspended for d sees of its monotonic clock when it runs again.
	skipped time.Duration
}

func (c *pausableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now().Add(c.skipped)
}

func (c *pausableClock) Skip(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.skipped += d
}

func (c *pausableClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *pausableClock) Freeze() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = time.Now()
}

func (c *pausableClock) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = time.Time{}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// sentWrite is one write request that reached the API server.
type sentWrite struct {
	method, path string
	status       int
	// afterLoss is set when the operation's context had ended, for the loss
	// of the lock, when the request was sent.
	afterLoss bool
}

// wireLog records every write a client sends to the API server. Its
// wrapper is the innermost of the client's transports (the first one set on
// the configuration), so a request the fence refuses never reaches it.
type wireLog struct {
	mu     sync.Mutex
	writes []sentWrite
	opCtx  atomic.Pointer[context.Context]
}

func (w *wireLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if !isWrite(req.Method) {
			return rt.RoundTrip(req)
		}
		after := false
		if p := w.opCtx.Load(); p != nil && errors.Is(context.Cause(*p), autorecover.ErrLost) {
			after = true
		}
		resp, err := rt.RoundTrip(req)
		if err == nil {
			w.mu.Lock()
			w.writes = append(w.writes, sentWrite{req.Method, req.URL.Path, resp.StatusCode, after})
			w.mu.Unlock()
		}
		return resp, err
	})
}

func (w *wireLog) Writes() []sentWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.writes)
}

// TestIntegrationExampleUpgrade runs the examples' two ways against the
// real API server: helm's own upgrade action, under the lock and through
// its fence, writes a release that stock helm reads, lists and upgrades
// further, and the lock is left released.
func TestIntegrationExampleUpgrade(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		upgrade func(context.Context, *rest.Config, string, string, *chart.Chart, map[string]any) error
	}{
		{"Run", upgradeWithRun},
		{"step by step", upgradeStepByStep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			installStock(t, env, ns)
			if err := tc.upgrade(ctx, env.Config, ns, releaseName, appChart(t, env), map[string]any{"message": "fenced"}); err != nil {
				t.Fatalf("upgrade under lock: %v", err)
			}
			if got := summary(t, env, ns); got != "1:superseded 2:deployed" {
				t.Fatalf("history = %s, want 1:superseded 2:deployed", got)
			}
			s := env.History(t, ns, releaseName)[1].Secret
			if s.Type != "helm.sh/release.v1" {
				t.Errorf("revision 2 Secret type = %q", s.Type)
			}
			for k, want := range map[string]string{"name": releaseName, "owner": "helm", "status": "deployed", "version": "2"} {
				if s.Labels[k] != want {
					t.Errorf("revision 2 label %s = %q, want %q", k, s.Labels[k], want)
				}
			}
			if s.Labels["modifiedAt"] == "" {
				t.Errorf("revision 2 has no modifiedAt label: %v", s.Labels)
			}

			h := stockHistory(t, env, ns)
			if len(h) != 2 || h[1]["status"] != "deployed" || h[1]["description"] != "Upgrade complete" {
				t.Errorf("stock helm history = %v", h)
			}
			r := env.Run(t, env.Helm4, "get", "values", releaseName, "-n", ns, "-o", "json")
			if r.ExitCode != 0 || !strings.Contains(r.Stdout, `"message":"fenced"`) {
				t.Errorf("stock helm get values: exit %d, %s %s", r.ExitCode, r.Stdout, r.Stderr)
			}
			if r := env.Run(t, env.Helm4, "status", releaseName, "-n", ns); r.ExitCode != 0 || !strings.Contains(r.Stdout, "REVISION: 2") {
				t.Errorf("stock helm status: exit %d, %s %s", r.ExitCode, r.Stdout, r.Stderr)
			}

			st, err := newClient(t, env.Config).Inspect(ctx, ns, releaseName)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != autorecover.LockFree || !st.LeaseExists || st.Holder == nil || st.Holder.ReleasedAt.IsZero() ||
				st.Holder.Operation != autorecover.OpUpgrade || st.Pending || st.LatestRevision != 2 {
				t.Fatalf("Inspect after the upgrade = %+v (holder %+v)", st, st.Holder)
			}
			if tc.name == "Run" && st.Holder.Revision != 2 {
				t.Errorf("Run's lock record names revision %d, want 2 (the revision it wrote)", st.Holder.Revision)
			}

			if r := env.Run(t, env.Helm4, "upgrade", releaseName, env.Chart("app"), "-n", ns, "--set", "message=stock"); r.ExitCode != 0 {
				t.Fatalf("stock helm upgrade after ours: %s", r.Stderr)
			}
			if got := summary(t, env, ns); got != "1:superseded 2:superseded 3:deployed" {
				t.Errorf("history after stock upgrade = %s", got)
			}
			// Our revision carries the labels stock helm's own upgrade
			// leaves on the revision it deployed (its driver's update keeps
			// no createdAt).
			if ours, stock := slices.Sorted(maps.Keys(s.Labels)), slices.Sorted(maps.Keys(env.History(t, ns, releaseName)[2].Secret.Labels)); !slices.Equal(ours, stock) {
				t.Errorf("label keys of our revision 2 %v, of stock helm's revision 3 %v", ours, stock)
			}
		})
	}
}

// TestIntegrationFencedRefusesAfterLockLost: a holder that stops renewing
// loses its lock to another client once it expires, and its fence then
// refuses its writes: nothing reaches the release records.
func TestIntegrationFencedRefusesAfterLockLost(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()

	t.Run("the next write", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		a, b := newClient(t, env.Config), newClient(t, env.Config)
		lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, LeaseDuration: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cfgA, err := lkA.ActionConfig()
		if err != nil {
			t.Fatal(err)
		}
		writes := recordWrites(cfgA)

		// A does not renew. B queues and takes the lock once it has expired.
		lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: generous})
		if err != nil {
			t.Fatalf("B waiting for the expired lock: %v", err)
		}
		releaseAtEnd(t, lkB)
		if prev, st := lkB.Previous(); st != autorecover.LockExpired || prev == nil || prev.Session != lkA.Session() {
			t.Fatalf("B's lock: previous %+v state %s, want A's expired lock", prev, st)
		}

		before := snapshot(t, env, ns)
		cmBefore, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, releaseName+"-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = newUpgrade(cfgA, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": "late"})
		if !errors.Is(err, autorecover.ErrLost) {
			t.Fatalf("A's upgrade after losing the lock: got %v, want ErrLost", err)
		}
		t.Logf("A's upgrade refused: %v", err)
		if w := writes.Writes(); len(w) == 0 || w[0].op != "create" || w[0].key != recordKey(2) || !errors.Is(w[0].err, autorecover.ErrLost) {
			t.Fatalf("helm's storage writes = %+v, want its create of revision 2 refused with ErrLost", w)
		}
		if after := snapshot(t, env, ns); !maps.Equal(before, after) {
			t.Fatalf("release records changed after the lock was lost: %v -> %v", before, after)
		}
		cmAfter, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, releaseName+"-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cmAfter.ResourceVersion != cmBefore.ResourceVersion || cmAfter.Data["message"] != "hello" {
			t.Fatalf("the release's ConfigMap was written after the lock was lost: %v", cmAfter.Data)
		}
		if err := lkA.Valid(); !errors.Is(err, autorecover.ErrLost) {
			t.Errorf("A's Valid = %v, want ErrLost", err)
		}
		if err := lkA.Renew(ctx); !errors.Is(err, autorecover.ErrLost) {
			t.Errorf("A's Renew = %v, want ErrLost", err)
		}
	})

	t.Run("in the middle of an upgrade", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		a, b := newClient(t, env.Config), newClient(t, env.Config)
		lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cfgA := actionConfig(t, env, ns)
		if err := autorecover.FencedStorage(cfgA, lkA); err != nil {
			t.Fatal(err)
		}
		writes := recordWrites(cfgA)
		// A starts at once and renews while it works; it stops renewing, as
		// if paused, once its pending revision is written. Its pods never
		// become ready, so its upgrade waits until it is cancelled.
		keepCtx, stopKeep := context.WithCancel(ctx)
		defer stopKeep()
		go lkA.Keep(keepCtx, nil)
		upCtx, cancelUp := context.WithCancel(ctx)
		defer cancelUp()
		chrt := appChart(t, env)
		var upErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, upErr = newUpgrade(cfgA, ns, 3*time.Minute).RunWithContext(upCtx, releaseName, chrt, neverReady)
		})
		env.WaitForStatus(t, ns, releaseName, 2, "pending-upgrade", generous)
		waitFor(t, "A's upgrade to apply its nodeSelector", func() bool { return len(nodeSelector(t, env, ns)) > 0 })
		stopKeep()
		// Started at once, the revision is usually created in the server
		// second of the acquisition, whose recorded time is an upper bound:
		// recovery below must still attribute it to A, since A's record
		// names revision 2.
		created, acquired := env.History(t, ns, releaseName)[1].Secret.CreationTimestamp.UTC(), lkA.Holder().AcquiredAt.UTC()
		t.Logf("revision 2 created at %s, A acquired the lock at %s (server time; same second: %t)",
			created.Format(time.RFC3339), acquired.Format(time.RFC3339Nano), created.Unix() == acquired.Unix())

		lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: generous})
		if err != nil {
			t.Fatalf("B waiting for the expired lock: %v", err)
		}
		releaseAtEnd(t, lkB)
		if err := lkA.Valid(); !errors.Is(err, autorecover.ErrLost) {
			t.Fatalf("A's Valid after B took over = %v, want ErrLost", err)
		}
		pending := snapshot(t, env, ns)
		// Helm marks its revision failed when its context ends: that write
		// comes after the loss and is refused.
		cancelUp()
		wg.Wait()
		t.Logf("A's upgrade ended with: %v", upErr)
		if upErr == nil {
			t.Fatal("A's upgrade succeeded although its pods never became ready")
		}
		w := writes.Writes()
		if len(w) < 2 || w[0].op != "create" || w[0].err != nil {
			t.Fatalf("helm's storage writes = %+v, want its create of revision 2, then writes after the loss", w)
		}
		for _, x := range w[1:] {
			if !errors.Is(x.err, autorecover.ErrLost) {
				t.Fatalf("helm's %s of %s after the loss: %v, want it refused with ErrLost", x.op, x.key, x.err)
			}
		}
		if after := snapshot(t, env, ns); !maps.Equal(pending, after) {
			t.Fatalf("release records changed after A lost its lock: %v -> %v", pending, after)
		}
		if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
			t.Fatalf("history = %s, want 1:deployed 2:pending-upgrade", got)
		}

		// B recovers what A abandoned, at once: it undoes what revision 2
		// applied, marks it failed naming A, and upgrades.
		d, err := lkB.Recover(ctx, autorecover.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Verdict != autorecover.VerdictRecover || d.Revision != 2 || d.AbandonedBy == nil || d.AbandonedBy.Session != lkA.Session() || !slices.Equal(d.Marked, []int{2}) {
			t.Fatalf("B's recovery = %+v", d)
		}
		t.Logf("recovered: %s", d.Reason)
		if ns := nodeSelector(t, env, ns); len(ns) != 0 {
			t.Errorf("after recovery the Deployment keeps the abandoned revision's nodeSelector %v", ns)
		}
		cfgB, err := lkB.ActionConfig()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newUpgrade(cfgB, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": "after recovery"}); err != nil {
			t.Fatalf("B's upgrade after recovery: %v", err)
		}
		h := stockHistory(t, env, ns)
		if len(h) != 3 || h[1]["status"] != "failed" || !strings.Contains(h[1]["description"].(string), lkA.Session()) || h[2]["status"] != "deployed" {
			t.Fatalf("stock helm history = %v", h)
		}
	})
}

// lostToTaker reports whether err is a refusal for a lost lock that names
// either of the two things that tell a frozen holder it lost: the taker's
// session on the record (the fence's check of the newest record), or the
// API server's clock past the holder's LOCKED TILL (Held.Valid, fed by the
// answers the fence saw: issue 31 item 3). Which comes first depends on
// whether an answer reached the fence after the expiry.
func lostToTaker(err error, taker *autorecover.Lock) bool {
	return errors.Is(err, autorecover.ErrLost) &&
		(strings.Contains(err.Error(), taker.Session()) || strings.Contains(err.Error(), "the API server's clock reads at least"))
}

// frozenValid checks that a frozen holder's own clock did not refuse its
// writes: its Valid is nil, or fails only because the API server's clock
// passed its LOCKED TILL, never for its own renew deadline.
func frozenValid(t *testing.T, lk *autorecover.Lock) {
	t.Helper()
	if err := lk.Valid(); err != nil && !strings.Contains(err.Error(), "the API server's clock reads at least") {
		t.Fatalf("A's Valid = %v; its own clock stood still, so only the API server's may have stopped it", err)
	}
}

// TestIntegrationFencedUpdateConflicts: what the fence guarantees about
// records someone else wrote. A holder paused between its check of the lock
// and its write (its clock frozen: its Valid still says yes) is refused
// once another session's lock sits on the newest record, both helm's create
// of the next revision and its rewrite of its own; and recovery never
// blindly overwrites a record another writer changed after it was read.
func TestIntegrationFencedUpdateConflicts(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	const lease = 3 * time.Second

	// paused takes A's lock with a clock frozen right after the acquisition,
	// and lets B take it over once it has expired in server time.
	paused := func(t *testing.T, ns string, rev int) *autorecover.Lock {
		t.Helper()
		clk := &pausableClock{}
		a := newClient(t, env.Config, autorecover.WithClock(clk))
		lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: rev, LeaseDuration: lease})
		if err != nil {
			t.Fatal(err)
		}
		clk.Freeze()
		t.Cleanup(func() {
			// Thawed, A finds its renew deadline long passed: whatever its
			// helm still tries is refused from then on.
			clk.Resume()
			if err := lkA.Valid(); !errors.Is(err, autorecover.ErrLost) {
				t.Errorf("A's Valid once thawed = %v, want ErrLost", err)
			}
		})
		return lkA
	}
	takeOver := func(t *testing.T, ns string, lkA *autorecover.Lock) *autorecover.Lock {
		t.Helper()
		lkB, err := newClient(t, env.Config).Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: generous})
		if err != nil {
			t.Fatalf("B waiting for A's expired lock: %v", err)
		}
		releaseAtEnd(t, lkB)
		if prev, st := lkB.Previous(); st != autorecover.LockExpired || prev == nil || prev.Session != lkA.Session() {
			t.Fatalf("B's lock: previous %+v state %s, want A's expired lock", prev, st)
		}
		// A, paused, still believes it holds the lock: its own check cannot
		// be what refuses its writes below.
		if err := lkA.Valid(); err != nil {
			t.Fatalf("A's Valid while paused = %v, want nil", err)
		}
		return lkB
	}

	t.Run("a paused holder's create", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		lkA := paused(t, ns, 2)
		cfgA := actionConfig(t, env, ns)
		if err := autorecover.FencedStorage(cfgA, lkA); err != nil {
			t.Fatal(err)
		}
		writes := recordWrites(cfgA)
		lkB := takeOver(t, ns, lkA)

		before := snapshot(t, env, ns)
		_, err := newUpgrade(cfgA, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": "late"})
		if !lostToTaker(err, lkB) {
			t.Fatalf("paused A's upgrade: got %v, want ErrLost naming B's session %s, or the API server's clock past A's LOCKED TILL", err, lkB.Session())
		}
		t.Logf("refused: %v", err)
		if w := writes.Writes(); len(w) != 1 || w[0].op != "create" || w[0].key != recordKey(2) {
			t.Fatalf("helm's storage writes = %+v, want only its refused create of revision 2", w)
		}
		if after := snapshot(t, env, ns); !maps.Equal(before, after) {
			t.Fatalf("release records changed: %v -> %v", before, after)
		}
		frozenValid(t, lkA)
	})

	t.Run("a paused holder's rewrite inside helm's upgrade", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		lkA := paused(t, ns, 2)
		cfgA, err := lkA.ActionConfig()
		if err != nil {
			t.Fatal(err)
		}
		writes := recordWrites(cfgA)
		upCtx, cancelUp := context.WithCancel(ctx)
		defer cancelUp()
		chrt := appChart(t, env)
		var upErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, upErr = newUpgrade(cfgA, ns, 3*time.Minute).RunWithContext(upCtx, releaseName, chrt, neverReady)
		})
		env.WaitForStatus(t, ns, releaseName, 2, "pending-upgrade", generous)
		lkB := takeOver(t, ns, lkA)
		if rec := readRecord(t, env, ns, 2); rec.Info.Status != common.StatusPendingUpgrade {
			t.Fatalf("revision 2 is %s", rec.Info.Status)
		}
		pending := snapshot(t, env, ns)

		// Helm marks revision 2 failed when its context ends: the record
		// carries B's lock by now, so the rewrite is refused.
		cancelUp()
		wg.Wait()
		t.Logf("A's upgrade ended with: %v", upErr)
		w := writes.Writes()
		if len(w) < 2 || w[0].op != "create" || w[0].err != nil || !slices.ContainsFunc(w[1:], func(x storageWrite) bool { return x.op == "update" && x.key == recordKey(2) }) {
			t.Fatalf("helm's storage writes = %+v, want its create of revision 2, then its update of it", w)
		}
		for _, x := range w[1:] {
			if !lostToTaker(x.err, lkB) {
				t.Fatalf("helm's %s of %s: %v, want ErrLost naming B's session %s, or the API server's clock past A's LOCKED TILL", x.op, x.key, x.err, lkB.Session())
			}
			t.Logf("refused: %s of %s: %v", x.op, x.key, x.err)
		}
		if after := snapshot(t, env, ns); !maps.Equal(pending, after) {
			t.Fatalf("release records changed after B took the lock: %v -> %v", pending, after)
		}
		frozenValid(t, lkA)

		// B recovers A's revision at once, naming A.
		d, err := lkB.Recover(ctx, autorecover.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Verdict != autorecover.VerdictRecover || d.AbandonedBy == nil || d.AbandonedBy.Session != lkA.Session() || !slices.Equal(d.Marked, []int{2}) {
			t.Fatalf("B's recovery = %+v", d)
		}
		if got := summary(t, env, ns); got != "1:deployed 2:failed" {
			t.Fatalf("history after B's recovery = %s", got)
		}
	})

	t.Run("recovery never overwrites another writer", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		createStockPending(t, env, ns)
		const legacyAfter = time.Second
		policy := autorecover.Policy{LegacyAfter: legacyAfter}
		waitRecoverable(t, newClient(t, env.Config), ns, policy)

		// Right before recovery sends its write of revision 2 (the one that
		// marks it failed), another tool blindly rewrites the record, as
		// stock helm's driver does.
		otherTool := func() error {
			stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
			got, err := stock.Get(recordKey(2))
			if err != nil {
				return err
			}
			r := got.(*rspb.Release)
			r.Info.Status, r.Info.Description = common.StatusFailed, "marked failed by another tool"
			return stock.Update(recordKey(2), r)
		}
		var fired atomic.Int32
		var sentStatus atomic.Int32
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method != http.MethodPut || !strings.HasSuffix(req.URL.Path, "/secrets/"+recordKey(2)) || !marksFailed(req) {
					return rt.RoundTrip(req)
				}
				first := fired.Add(1) == 1
				if first {
					if err := otherTool(); err != nil {
						return nil, fmt.Errorf("the other tool's write: %w", err)
					}
				}
				resp, err := rt.RoundTrip(req)
				if first && err == nil {
					sentStatus.Store(int32(resp.StatusCode))
				}
				return resp, err
			})
		})
		d, err := newClient(t, cfg).Recover(ctx, autorecover.RecoverRequest{Release: releaseName, Namespace: ns, Policy: policy})
		if err != nil {
			t.Fatalf("Recover: %v", err)
		}
		if fired.Load() != 1 {
			t.Fatalf("recovery sent %d writes marking revision 2 failed, want exactly 1 (the one that met the other tool)", fired.Load())
		}
		if sentStatus.Load() != http.StatusConflict {
			t.Fatalf("the API server answered recovery's write with %d, want 409 Conflict", sentStatus.Load())
		}
		if d.Verdict != autorecover.VerdictProceed || len(d.Marked) != 0 {
			t.Fatalf("recovery after the other tool resolved the revision = %+v, want proceed with nothing marked", d)
		}
		t.Logf("recovery read again and found: %s", d.Reason)
		if info := readRecord(t, env, ns, 2).Info; info.Status != common.StatusFailed || info.Description != "marked failed by another tool" {
			t.Fatalf("the other tool's record was overwritten: %+v", info)
		}
	})
}

// marksFailed reports whether req writes a helm record labelled failed.
func marksFailed(req *http.Request) bool {
	if req.Body == nil {
		return false
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	req.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if err != nil {
		return false
	}
	s, ok := obj.(*corev1.Secret)
	return ok && s.Labels["status"] == string(common.StatusFailed)
}

// waitFor polls cond until it holds, and fails the test if it does not
// within a generous limit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(generous)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", generous, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRecoverable waits until a dry run judges the release's pending
// revision recoverable under p (stock helm's, once older than
// p.LegacyAfter in server time), and fails the test if it never is.
func waitRecoverable(t *testing.T, c *autorecover.Client, ns string, p autorecover.Policy) autorecover.Decision {
	t.Helper()
	deadline := time.Now().Add(generous)
	for {
		d, err := c.Recover(context.Background(), autorecover.RecoverRequest{Release: releaseName, Namespace: ns, Policy: p, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if d.Verdict == autorecover.VerdictRecover {
			return d
		}
		if d.Verdict != autorecover.VerdictBlocked || d.RetryAfter <= 0 || time.Now().After(deadline) {
			t.Fatalf("dry run = %+v, want it recoverable", d)
		}
		time.Sleep(min(d.RetryAfter, time.Second))
	}
}

// TestIntegrationRecoverAndInspect: a release stock helm left pending is
// reported by Inspect, is not recovered while younger than LegacyAfter, is
// judged recoverable by a dry run without any write, and is then recovered;
// a live lock blocks Recover and names its holder.
func TestIntegrationRecoverAndInspect(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	installStock(t, env, ns)
	createStockPending(t, env, ns)
	c := newClient(t, env.Config)

	st, err := c.Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockFree || st.LeaseExists || !st.Pending || st.LatestRevision != 2 || st.LatestStatus != "pending-upgrade" || st.Revisions != 2 {
		t.Fatalf("Inspect of a release stuck by stock helm = %+v", st)
	}

	d, err := c.Recover(ctx, autorecover.RecoverRequest{Release: releaseName, Namespace: ns, Policy: autorecover.Policy{LegacyAfter: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictBlocked || d.RetryAfter <= 0 || len(d.Marked) != 0 {
		t.Fatalf("Recover of a young legacy revision = %+v", d)
	}
	t.Logf("blocked: %s", d.Reason)
	if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after a blocked Recover = %s", got)
	}

	const legacyAfter = time.Second
	policy := autorecover.Policy{LegacyAfter: legacyAfter}
	before := snapshot(t, env, ns)
	d = waitRecoverable(t, c, ns, policy)
	if d.Revision != 2 || d.AbandonedBy != nil || len(d.Marked) != 0 {
		t.Fatalf("dry run = %+v", d)
	}
	if after := snapshot(t, env, ns); !maps.Equal(before, after) {
		t.Fatalf("dry run wrote: %v -> %v", before, after)
	}

	// A live holder blocks recovery, and is named.
	holder := newClient(t, env.Config)
	lk, err := holder.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpRollback, Who: "alice@laptop"})
	if err != nil {
		t.Fatal(err)
	}
	d, err = c.Recover(ctx, autorecover.RecoverRequest{Release: releaseName, Namespace: ns, Policy: policy})
	locked, ok := errors.AsType[*autorecover.LockedError](err)
	if !ok || locked.Holder == nil || locked.Holder.Who != "alice@laptop" || locked.HolderSession != lk.Session() || locked.LockedTill.IsZero() {
		t.Fatalf("Recover under a live lock: got %v (%+v), want a *LockedError naming alice", err, locked)
	}
	if d.Verdict != autorecover.VerdictBlocked {
		t.Errorf("Recover under a live lock: verdict %s, want blocked", d.Verdict)
	}
	t.Logf("refused: %v", err)
	st, err = c.Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockLive || st.HolderSession != lk.Session() || st.Holder == nil || st.Holder.Operation != autorecover.OpRollback || st.LockedTill.IsZero() {
		t.Fatalf("Inspect under a live lock = %+v", st)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	d, err = c.Recover(ctx, autorecover.RecoverRequest{Release: releaseName, Namespace: ns, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictRecover || !slices.Equal(d.Marked, []int{2}) {
		t.Fatalf("Recover = %+v", d)
	}
	t.Logf("recovered: %s", d.Reason)
	h := stockHistory(t, env, ns)
	if len(h) != 2 || h[1]["status"] != "failed" || !strings.Contains(h[1]["description"].(string), "no lock record") {
		t.Fatalf("stock helm history after recovery = %v", h)
	}
	st, err = c.Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending || st.State != autorecover.LockFree {
		t.Fatalf("Inspect after recovery = %+v", st)
	}
	// The release is usable again by stock helm.
	if r := env.Run(t, env.Helm4, "upgrade", releaseName, env.Chart("app"), "-n", ns); r.ExitCode != 0 {
		t.Fatalf("stock helm upgrade after recovery: %s", r.Stderr)
	}
}

// TestIntegrationReleaseAfterFailedRecoverHandsOn: B takes over A's expired
// lock, its Recover fails, it releases; C's Recover then recovers A's
// revision at once, naming A, instead of taking it for stock helm's.
func TestIntegrationReleaseAfterFailedRecoverHandsOn(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	installStock(t, env, ns)
	a, b, c := newClient(t, env.Config), newClient(t, env.Config), newClient(t, env.Config)
	lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A writes its revision at once, then dies.
	createPendingUnder(t, env, ns, lkA)

	// B takes over and fails to recover (its context has ended).
	lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: generous})
	if err != nil {
		t.Fatal(err)
	}
	if prev, st := lkB.Previous(); st != autorecover.LockExpired || prev == nil || prev.Session != lkA.Session() {
		t.Fatalf("B found %+v %s, want A's expired lock", prev, st)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lkB.Recover(ended, autorecover.Policy{}); err == nil {
		t.Fatal("B's Recover with an ended context succeeded")
	}
	if err := lkB.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after B's failed recovery = %s", got)
	}

	lkC, err := c.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade})
	if err != nil {
		t.Fatal(err)
	}
	releaseAtEnd(t, lkC)
	if prev, st := lkC.Previous(); st != autorecover.LockExpired || prev == nil || prev.Session != lkA.Session() {
		t.Errorf("C found %+v %s, want A's lock, handed on as expired", prev, st)
	}
	d, err := lkC.Recover(ctx, autorecover.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictRecover || d.AbandonedBy == nil || d.AbandonedBy.Session != lkA.Session() || !slices.Equal(d.Marked, []int{2}) {
		t.Fatalf("C's recovery = %+v (%s)", d, d.Reason)
	}
	t.Logf("recovered: %s", d.Reason)
}

// runUpgrade is an op for Client.Run: helm's upgrade with values.
func runUpgrade(t *testing.T, env *testenv.Env, ns string, values map[string]any) func(context.Context, *action.Configuration) error {
	return func(ctx context.Context, cfg *action.Configuration) error {
		_, err := newUpgrade(cfg, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), values)
		return err
	}
}

func upgradeRequest(ns string) autorecover.LockRequest {
	return autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Timeout: time.Minute}
}

// TestIntegrationRun: Client.Run around helm's upgrade. (Its happy path,
// read and upgraded further by stock helm, is TestIntegrationExampleUpgrade's
// "Run".)
func TestIntegrationRun(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()

	t.Run("refused while another client holds the lock", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		lk, err := newClient(t, env.Config).Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpRollback, Who: "alice@laptop"})
		if err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, env, ns)
		if _, ok := before["lease/"+lock.LeaseName(releaseName)]; !ok {
			t.Fatalf("the holder's lock has no Lease to compare: %v", before)
		}
		called := false
		err = newClient(t, env.Config).Run(ctx, autorecover.RunConfig{Lock: upgradeRequest(ns)}, func(context.Context, *action.Configuration) error {
			called = true
			return nil
		})
		locked, ok := errors.AsType[*autorecover.LockedError](err)
		if !ok || !errors.Is(err, autorecover.ErrLocked) || locked.HolderSession != lk.Session() || locked.Holder == nil || locked.Holder.Who != "alice@laptop" {
			t.Fatalf("Run under a live lock = %v (%+v), want a *LockedError naming alice's session %s", err, locked, lk.Session())
		}
		if called {
			t.Fatal("Run called its operation under another client's live lock")
		}
		t.Logf("refused: %v", err)
		if after := snapshot(t, env, ns); !maps.Equal(before, after) {
			t.Fatalf("the refused Run wrote: %v -> %v", before, after)
		}

		// With Wait, Run queues, and runs once the holder releases.
		req := upgradeRequest(ns)
		req.Wait = generous
		waiting := make(chan struct{})
		var once sync.Once
		req.OnWait = func(h *autorecover.Holder, _ time.Duration) {
			if h != nil && h.Session == lk.Session() {
				once.Do(func() { close(waiting) })
			}
		}
		done := make(chan error, 1)
		go func() {
			done <- newClient(t, env.Config).Run(ctx, autorecover.RunConfig{Lock: req}, runUpgrade(t, env, ns, map[string]any{"message": "after waiting"}))
		}()
		select {
		case <-waiting:
		case err := <-done:
			t.Fatalf("Run returned before queueing behind the holder: %v", err)
		case <-time.After(generous):
			t.Fatal("Run never reported waiting for the holder")
		}
		if got := summary(t, env, ns); got != "1:deployed" {
			t.Fatalf("history while Run waits = %s", got)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run after the holder released: %v", err)
		}
		if got := summary(t, env, ns); got != "1:superseded 2:deployed" {
			t.Fatalf("history after the waiting Run = %s", got)
		}
	})

	t.Run("a lock taken from it stops the operation", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		bin := env.Bin(t)
		run := startLosingRun(t, env, ns, nil)
		// An operator force-releases the live lock (the holder looks
		// wedged), which also marks revision 2 failed. Run finds its lock
		// gone at its next renewal.
		r := env.Run(t, bin, "unlock", releaseName, "--session", run.session, "--force", "--yes", "-n", ns)
		if r.ExitCode != 0 {
			t.Fatalf("helm-autorecover unlock --force: exit %d: %s", r.ExitCode, r.Stderr)
		}
		t.Logf("unlock: %s%s", r.Stdout, r.Stderr)
		res := run.wait(t)
		res.check(t)
		// Whatever became of revision 2, helm's own failure write (its
		// description "Upgrade \"web\" failed: ...") never landed.
		if rec := readRecord(t, env, ns, 2); strings.Contains(rec.Info.Description, "Upgrade \"web\" failed") || rec.Info.Status == common.StatusDeployed {
			t.Fatalf("helm wrote revision 2 after the loss: %s: %s", rec.Info.Status, rec.Info.Description)
		}
		t.Logf("history: %s", summary(t, env, ns))
	})

	// A process suspended past its lease (SIGSTOP, a frozen VM) finds, when
	// it runs again, that its renew deadline has passed.
	suspend := func(t *testing.T, ns string) (*losingRun, losingResult) {
		t.Helper()
		installStock(t, env, ns)
		clk := &pausableClock{}
		run := startLosingRun(t, env, ns, clk)
		clk.Skip(2 * run.req.LeaseDuration)
		return run, run.wait(t)
	}

	t.Run("a lock not renewed in time stops the operation", func(t *testing.T) {
		_, res := suspend(t, env.Namespace(t))
		res.check(t)
		if !strings.Contains(res.cause.Error(), "renew deadline") {
			t.Errorf("cause = %v, want the renew deadline", res.cause)
		}
	})

	t.Run("nothing is written after the loss, and the next client recovers at once", func(t *testing.T) {
		ns := env.Namespace(t)
		run, res := suspend(t, ns)
		res.check(t)
		for _, w := range res.wire {
			if w.afterLoss && w.status/100 == 2 {
				t.Errorf("written after the loss: %s %s (%d)", w.method, w.path, w.status)
			}
		}
		if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
			t.Fatalf("history = %s, want 1:deployed 2:pending-upgrade", got)
		}
		// As with the helm-autorecover CLI (a holder that stops renewing
		// leaves its lock to expire), the next client recovers revision 2
		// as soon as the lock has expired, naming Run's session.
		d, err := newClient(t, env.Config).Recover(ctx, autorecover.RecoverRequest{
			Release: releaseName, Namespace: ns,
			Policy: autorecover.Policy{LegacyAfter: autorecover.DefaultLegacyAfter}, Wait: generous,
		})
		if err != nil {
			t.Fatal(err)
		}
		if d.Verdict != autorecover.VerdictRecover || d.AbandonedBy == nil || d.AbandonedBy.Session != run.session || !slices.Equal(d.Marked, []int{2}) {
			t.Fatalf("the next client's recovery = %s: %s; want revision 2 recovered at once as abandoned by session %s", d.Verdict, d.Reason, run.session)
		}
	})

	t.Run("recovers a dead holder's revision", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		dead, err := newClient(t, env.Config).Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		createPendingUnder(t, env, ns, dead)
		req := upgradeRequest(ns)
		req.Wait = generous
		if err := newClient(t, env.Config).Run(ctx, autorecover.RunConfig{Lock: req}, runUpgrade(t, env, ns, map[string]any{"message": "after recovery"})); err != nil {
			t.Fatalf("Run after the holder died: %v", err)
		}
		h := stockHistory(t, env, ns)
		if len(h) != 3 || h[1]["status"] != "failed" || !strings.Contains(h[1]["description"].(string), dead.Session()) || h[2]["status"] != "deployed" {
			t.Fatalf("stock helm history = %v", h)
		}
	})

	t.Run("blocked by a young revision stock helm left pending", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		createStockPending(t, env, ns)
		called := false
		err := newClient(t, env.Config).Run(ctx, autorecover.RunConfig{Lock: upgradeRequest(ns), Policy: autorecover.Policy{LegacyAfter: time.Hour}},
			func(context.Context, *action.Configuration) error {
				called = true
				return nil
			})
		blocked, ok := errors.AsType[*autorecover.BlockedError](err)
		if !ok || !errors.Is(err, autorecover.ErrBlocked) || blocked.Decision.Revision != 2 || blocked.Decision.RetryAfter <= 0 {
			t.Fatalf("Run over a young legacy pending revision = %v (%+v), want a *BlockedError", err, blocked)
		}
		if called {
			t.Fatal("Run called its operation although the release is pending")
		}
		if got := summary(t, env, ns); got != "1:deployed 2:pending-upgrade" {
			t.Fatalf("history = %s", got)
		}
	})

	t.Run("backends exclude each other", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		byRecord := newClient(t, env.Config, autorecover.WithLockBackend(autorecover.BackendRelease))
		byLease := newClient(t, env.Config, autorecover.WithLockBackend(autorecover.BackendLease))

		// nested runs other's Run while the outer Run holds the lock, then
		// upgrades; it fails unless other was refused naming session.
		nested := func(other *autorecover.Client, session string, message string) func(context.Context, *action.Configuration) error {
			return func(ctx context.Context, cfg *action.Configuration) error {
				called := false
				err := other.Run(ctx, autorecover.RunConfig{Lock: upgradeRequest(ns)}, func(context.Context, *action.Configuration) error {
					called = true
					return nil
				})
				locked, ok := errors.AsType[*autorecover.LockedError](err)
				if !ok || locked.HolderSession != session || called {
					return fmt.Errorf("the other backend's Run under our lock = %w (op called: %t), want a *LockedError naming session %s", err, called, session)
				}
				t.Logf("the other backend was refused: %v", err)
				_, err = newUpgrade(cfg, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": message})
				return err
			}
		}

		req := upgradeRequest(ns)
		req.Session = "record-backend-" + ns
		if err := byRecord.Run(ctx, autorecover.RunConfig{Lock: req}, nested(byLease, req.Session, "by record")); err != nil {
			t.Fatalf("Run with BackendRelease: %v", err)
		}
		if _, ok := leaseVersion(t, env, ns); ok {
			t.Fatal("a Lease exists after BackendRelease's Run and a refused BackendLease Run")
		}

		req = upgradeRequest(ns)
		req.Session = "lease-backend-" + ns
		if err := byLease.Run(ctx, autorecover.RunConfig{Lock: req}, nested(byRecord, req.Session, "by lease")); err != nil {
			t.Fatalf("Run with BackendLease: %v", err)
		}
		if _, ok := leaseVersion(t, env, ns); !ok {
			t.Fatal("BackendLease's Run left no Lease")
		}
		if got := summary(t, env, ns); got != "1:superseded 2:superseded 3:deployed" {
			t.Fatalf("history = %s", got)
		}
		r := env.Run(t, env.Helm4, "get", "values", releaseName, "-n", ns, "-o", "json")
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, `"message":"by lease"`) {
			t.Errorf("stock helm get values: exit %d, %s %s", r.ExitCode, r.Stdout, r.Stderr)
		}
	})
}

// losingRun is a Client.Run whose upgrade waits for pods that never become
// ready, until the lock is lost.
type losingRun struct {
	req     autorecover.LockRequest
	session string
	wire    *wireLog
	done    chan losingResult
}

// losingResult is what a losingRun saw.
type losingResult struct {
	// err is Run's error, cause the cause of op's context.
	err, cause error
	// writes are helm's storage writes, wire every write the client sent.
	writes []storageWrite
	wire   []sentWrite
}

// startLosingRun starts the Run (with clk as the client's clock when not
// nil) and waits until its revision 2 is pending.
func startLosingRun(t *testing.T, env *testenv.Env, ns string, clk clock.Clock) *losingRun {
	t.Helper()
	chrt := appChart(t, env)
	run := &losingRun{wire: &wireLog{}, done: make(chan losingResult, 1)}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(run.wire.wrap)
	var opts []autorecover.Option
	if clk != nil {
		opts = append(opts, autorecover.WithClock(clk))
	}
	c := newClient(t, cfg, opts...)
	run.req = upgradeRequest(ns)
	run.req.LeaseDuration = 3 * time.Second
	run.req.Timeout = 3 * time.Minute
	go func() {
		var res losingResult
		res.err = c.Run(context.Background(), autorecover.RunConfig{Lock: run.req}, func(ctx context.Context, cfg *action.Configuration) error {
			run.wire.opCtx.Store(&ctx)
			rec := recordWrites(cfg)
			_, err := newUpgrade(cfg, ns, run.req.Timeout).RunWithContext(ctx, releaseName, chrt, neverReady)
			res.cause = context.Cause(ctx)
			res.writes = rec.Writes()
			return err
		})
		res.wire = run.wire.Writes()
		run.done <- res
	}()
	env.WaitForStatus(t, ns, releaseName, 2, "pending-upgrade", generous)
	st, err := newClient(t, env.Config).Inspect(context.Background(), ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockLive || st.HolderSession == "" {
		t.Fatalf("Inspect while Run's upgrade waits = %+v", st)
	}
	run.session = st.HolderSession
	return run
}

func (r *losingRun) wait(t *testing.T) losingResult {
	t.Helper()
	select {
	case res := <-r.done:
		t.Logf("Run returned: %v", res.err)
		for _, w := range res.wire {
			if w.afterLoss {
				t.Logf("sent after the loss: %s %s, answered %d", w.method, w.path, w.status)
			}
		}
		return res
	case <-time.After(generous):
		t.Fatal("Run did not stop after losing its lock")
	}
	return losingResult{}
}

// check: Run and its operation were told of the loss, and helm's writes
// after it (marking its revision failed) were attempted and refused by the
// fence.
func (res losingResult) check(t *testing.T) {
	t.Helper()
	if !errors.Is(res.err, autorecover.ErrLost) {
		t.Fatalf("Run after losing its lock = %v, want an error wrapping ErrLost", res.err)
	}
	if !errors.Is(res.cause, autorecover.ErrLost) {
		t.Fatalf("the operation's context cause = %v, want one wrapping ErrLost", res.cause)
	}
	if len(res.writes) < 2 || res.writes[0].op != "create" || res.writes[0].err != nil {
		t.Fatalf("helm's storage writes = %+v, want its create of revision 2, then writes after the loss", res.writes)
	}
	for _, w := range res.writes[1:] {
		if !errors.Is(w.err, autorecover.ErrLost) {
			t.Fatalf("helm's %s of %s after the loss: %v, want it refused with ErrLost", w.op, w.key, w.err)
		}
	}
}
