package autorecover_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

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

func newClient(t *testing.T, env *testenv.Env) *autorecover.Client {
	t.Helper()
	c, err := autorecover.NewClient(env.Config)
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

// snapshot maps each revision Secret of the release to its resourceVersion.
func snapshot(t *testing.T, env *testenv.Env, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range env.History(t, ns, releaseName) {
		out[r.Secret.Name] = r.Secret.ResourceVersion
	}
	return out
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

// TestIntegrationExampleUpgrade runs the examples' upgradeUnderLock against
// the real API server: helm's own upgrade action, with the fenced driver,
// writes a release that stock helm reads, lists and upgrades further.
func TestIntegrationExampleUpgrade(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	installStock(t, env, ns)

	start := time.Now()
	if err := upgradeUnderLock(ctx, env.Config, getter(env, ns), ns, releaseName, appChart(t, env), map[string]any{"message": "fenced"}); err != nil {
		t.Fatalf("upgrade under lock: %v", err)
	}
	t.Logf("fenced upgrade under lock took %s", time.Since(start).Round(time.Millisecond))

	if got := strings.Join(env.Summary(t, ns, releaseName), " "); got != "1:superseded 2:deployed" {
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
	for _, k := range []string{"createdAt", "modifiedAt"} {
		if s.Labels[k] == "" {
			t.Errorf("revision 2 has no %s label: %v", k, s.Labels)
		}
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
	if r := env.Run(t, env.Helm4, "upgrade", releaseName, env.Chart("app"), "-n", ns, "--set", "message=stock"); r.ExitCode != 0 {
		t.Fatalf("stock helm upgrade after ours: %s", r.Stderr)
	}
	if got := strings.Join(env.Summary(t, ns, releaseName), " "); got != "1:superseded 2:superseded 3:deployed" {
		t.Errorf("history after stock upgrade = %s", got)
	}

	st, err := newClient(t, env).Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockFree || !st.LeaseExists || st.Holder == nil || st.Holder.ReleasedAt.IsZero() ||
		st.Pending || st.LatestRevision != 3 || st.LatestStatus != "deployed" {
		t.Errorf("Inspect after the upgrade = %+v (holder %+v)", st, st.Holder)
	}
}

// TestIntegrationFencedRefusesAfterLockLost: a holder that stops renewing
// loses its lock to another client once it expires, and the fenced driver
// then refuses its writes: nothing reaches the release records.
func TestIntegrationFencedRefusesAfterLockLost(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	const lease = 3 * time.Second

	t.Run("the next write", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		a, b := newClient(t, env), newClient(t, env)
		lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, LeaseDuration: lease})
		if err != nil {
			t.Fatal(err)
		}
		cfgA := actionConfig(t, env, ns)
		if err := autorecover.FencedStorage(cfgA, lkA); err != nil {
			t.Fatal(err)
		}

		// A does not renew. B queues and takes the lock once it has expired.
		start := time.Now()
		lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: 20 * time.Second})
		if err != nil {
			t.Fatalf("B waiting for the expired lock: %v", err)
		}
		releaseAtEnd(t, lkB)
		t.Logf("B took the lock over %s after it started waiting (lease %s)", time.Since(start).Round(time.Millisecond), lease)
		if lkB.PreviousState != autorecover.LockExpired || lkB.Previous == nil || lkB.Previous.Session != lkA.Session() {
			t.Fatalf("B's lock: previous %+v state %s, want A's expired lock", lkB.Previous, lkB.PreviousState)
		}

		before := snapshot(t, env, ns)
		_, err = newUpgrade(cfgA, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": "late"})
		if !errors.Is(err, autorecover.ErrLost) {
			t.Fatalf("A's upgrade after losing the lock: got %v, want ErrLost", err)
		}
		t.Logf("A's upgrade refused: %v", err)
		if after := snapshot(t, env, ns); !maps.Equal(before, after) {
			t.Fatalf("release records changed after the lock was lost: %v -> %v", before, after)
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
		a, b := newClient(t, env), newClient(t, env)
		const aLease = 5 * time.Second
		lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: aLease})
		if err != nil {
			t.Fatal(err)
		}
		cfgA := actionConfig(t, env, ns)
		if err := autorecover.FencedStorage(cfgA, lkA); err != nil {
			t.Fatal(err)
		}
		// A works normally for a while and renews once before it starts.
		// (Starting at once can make recovery misjudge the revision as
		// written before A's tenure: AcquiredAt is an upper bound of server
		// time, up to about a second late, and creationTimestamp is
		// truncated to the second; recovery then falls back to the legacy
		// rule. That belongs to recovery.Decide, not to fencing.)
		time.Sleep(2 * time.Second)
		if err := lkA.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		// Pods that never schedule keep the upgrade waiting past A's lease;
		// A does not renew, as if it were paused.
		var upErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, upErr = newUpgrade(cfgA, ns, 12*time.Second).RunWithContext(ctx, releaseName, appChart(t, env),
				map[string]any{"nodeSelector": map[string]any{"no-such-node": "true"}})
		})
		env.WaitForStatus(t, ns, releaseName, 2, "pending-upgrade", 10*time.Second)
		pending := snapshot(t, env, ns)

		lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: 20 * time.Second})
		if err != nil {
			t.Fatalf("B waiting for the expired lock: %v", err)
		}
		releaseAtEnd(t, lkB)
		wg.Wait()
		t.Logf("A's upgrade ended with: %v", upErr)
		if upErr == nil {
			t.Fatal("A's upgrade succeeded although its pods never became ready")
		}
		// Helm tried to write revision 1 back and revision 2 as failed;
		// both writes came after the loss and were refused.
		if after := snapshot(t, env, ns); !maps.Equal(pending, after) {
			t.Fatalf("release records changed after A lost its lock: %v -> %v", pending, after)
		}
		if got := strings.Join(env.Summary(t, ns, releaseName), " "); got != "1:deployed 2:pending-upgrade" {
			t.Fatalf("history = %s, want 1:deployed 2:pending-upgrade", got)
		}

		// B recovers what A abandoned, at once, and upgrades.
		d, err := lkB.Recover(ctx, autorecover.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Verdict != autorecover.VerdictRecover || d.Revision != 2 || d.AbandonedBy == nil || d.AbandonedBy.Session != lkA.Session() || !equalInts(d.Marked, []int{2}) {
			t.Fatalf("B's recovery = %+v", d)
		}
		t.Logf("recovered: %s", d.Reason)
		cfgB := actionConfig(t, env, ns)
		if err := autorecover.FencedStorage(cfgB, lkB); err != nil {
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

// releaseAtEnd gives the lock back when the test ends.
func releaseAtEnd(t *testing.T, lk *autorecover.Lock) {
	t.Cleanup(func() {
		if err := lk.Release(context.Background()); err != nil {
			t.Errorf("releasing the lock: %v", err)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// interceptSecrets runs before(obj) ahead of every Update it passes on.
type interceptSecrets struct {
	corev1client.SecretInterface
	before func(*corev1.Secret)
}

func (s *interceptSecrets) Update(ctx context.Context, obj *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	s.before(obj)
	return s.SecretInterface.Update(ctx, obj, opts)
}

// TestIntegrationFencedUpdateConflicts: a blind write to the release Secret
// between the fenced driver's read and its update (stock helm's driver
// sends no resourceVersion) makes the update fail with a conflict, and the
// other writer's record survives.
func TestIntegrationFencedUpdateConflicts(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	key := func(rev int) string { return "sh.helm.release.v1." + releaseName + ".v" + strconv.Itoa(rev) }
	blind := func(t *testing.T, ns, k, desc string) {
		t.Helper()
		stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
		got, err := stock.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		r := got.(*rspb.Release)
		r.Info.Status = common.StatusFailed
		r.Info.Description = desc
		if err := stock.Update(k, r); err != nil {
			t.Fatal(err)
		}
	}
	readBack := func(t *testing.T, ns, k string) *rspb.Info {
		t.Helper()
		got, err := driver.NewSecrets(env.Client.CoreV1().Secrets(ns)).Get(k)
		if err != nil {
			t.Fatal(err)
		}
		return got.(*rspb.Release).Info
	}

	t.Run("driver", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		c := newClient(t, env)
		lk, err := c.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade})
		if err != nil {
			t.Fatal(err)
		}
		releaseAtEnd(t, lk)
		d, err := autorecover.NewFencedDriver(c.Kubernetes().CoreV1().Secrets(ns), lk)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Get(key(1))
		if err != nil {
			t.Fatal(err)
		}
		blind(t, ns, key(1), "written by another tool")
		mine := got.(*rspb.Release)
		mine.Info.Description = "written by the fenced driver"
		err = d.Update(key(1), mine)
		if !errors.Is(err, autorecover.ErrConflict) || !apierrors.IsConflict(err) {
			t.Fatalf("fenced Update after a concurrent write: got %v, want ErrConflict from the API server", err)
		}
		t.Logf("refused: %v", err)
		if info := readBack(t, ns, key(1)); info.Description != "written by another tool" || info.Status != common.StatusFailed {
			t.Fatalf("the other writer's record was overwritten: %+v", info)
		}
	})

	t.Run("inside helm's upgrade", func(t *testing.T) {
		ns := env.Namespace(t)
		installStock(t, env, ns)
		c := newClient(t, env)
		lk, err := c.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2})
		if err != nil {
			t.Fatal(err)
		}
		releaseAtEnd(t, lk)
		var once sync.Once
		secrets := &interceptSecrets{
			SecretInterface: c.Kubernetes().CoreV1().Secrets(ns),
			before: func(obj *corev1.Secret) {
				if obj.Name == key(2) {
					// After helm created revision 2 pending and before it
					// writes it deployed, someone else marks it failed.
					once.Do(func() { blind(t, ns, key(2), "marked failed by another tool") })
				}
			},
		}
		d, err := autorecover.NewFencedDriver(secrets, lk)
		if err != nil {
			t.Fatal(err)
		}
		cfg := actionConfig(t, env, ns)
		cfg.Releases = storage.Init(d)
		_, err = newUpgrade(cfg, ns, time.Minute).RunWithContext(ctx, releaseName, appChart(t, env), map[string]any{"message": "v2"})
		if !errors.Is(err, autorecover.ErrConflict) || !apierrors.IsConflict(err) {
			t.Fatalf("upgrade with a concurrent write to its revision: got %v, want ErrConflict", err)
		}
		t.Logf("upgrade refused: %v", err)
		if info := readBack(t, ns, key(2)); info.Description != "marked failed by another tool" || info.Status != common.StatusFailed {
			t.Fatalf("the other writer's record was overwritten: %+v", info)
		}
		if h := stockHistory(t, env, ns); len(h) != 2 || h[1]["description"] != "marked failed by another tool" {
			t.Fatalf("stock helm history = %v", h)
		}
	})
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
	// Stock helm's driver writes revision 2 pending with no lock: a killed
	// `helm upgrade`.
	stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	got, err := stock.Get("sh.helm.release.v1." + releaseName + ".v1")
	if err != nil {
		t.Fatal(err)
	}
	r := got.(*rspb.Release)
	r.Version = 2
	r.Info.Status = common.StatusPendingUpgrade
	r.Info.Description = "Preparing upgrade"
	if err := stock.Create("sh.helm.release.v1."+releaseName+".v2", r); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, env)

	st, err := c.Inspect(ctx, ns, releaseName)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != autorecover.LockFree || st.LeaseExists || !st.Pending || st.LatestRevision != 2 || st.LatestStatus != "pending-upgrade" || st.Revisions != 2 {
		t.Fatalf("Inspect of a release stuck by stock helm = %+v", st)
	}

	const legacyAfter = time.Second
	d, err := c.Recover(ctx, ns, releaseName, autorecover.Policy{LegacyAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictBlocked || d.RetryAfter <= 0 || len(d.Marked) != 0 {
		t.Fatalf("Recover of a young legacy revision = %+v", d)
	}
	t.Logf("blocked: %s", d.Reason)

	// Server timestamps keep whole seconds: wait until the revision is
	// certainly older than legacyAfter.
	time.Sleep(legacyAfter + 2*time.Second)
	before := snapshot(t, env, ns)
	d, err = c.Recover(ctx, ns, releaseName, autorecover.Policy{LegacyAfter: legacyAfter, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictRecover || d.Revision != 2 || d.AbandonedBy != nil || len(d.Marked) != 0 {
		t.Fatalf("dry run = %+v", d)
	}
	if after := snapshot(t, env, ns); !maps.Equal(before, after) {
		t.Fatalf("dry run wrote: %v -> %v", before, after)
	}

	// A live holder blocks recovery, and is named.
	holder := newClient(t, env)
	lk, err := holder.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpRollback, Who: "alice@laptop"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d, err = c.Recover(ctx, ns, releaseName, autorecover.Policy{LegacyAfter: legacyAfter})
	locked, ok := errors.AsType[*autorecover.LockedError](err)
	if !ok || locked.Holder == nil || locked.Holder.Who != "alice@laptop" || locked.HolderSession != lk.Session() || locked.LockedTill.IsZero() {
		t.Fatalf("Recover under a live lock: got %v (%+v), want a *LockedError naming alice", err, locked)
	}
	if d.Verdict != autorecover.VerdictBlocked {
		t.Errorf("Recover under a live lock: verdict %s, want blocked", d.Verdict)
	}
	t.Logf("refused within %s: %v", time.Since(start).Round(time.Millisecond), err)
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

	d, err = c.Recover(ctx, ns, releaseName, autorecover.Policy{LegacyAfter: legacyAfter})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictRecover || !equalInts(d.Marked, []int{2}) {
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
	a, b, c := newClient(t, env), newClient(t, env), newClient(t, env)
	lkA, err := a.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Revision: 2, LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// (Renewed a second later, before the revision is written: see "in the
	// middle of an upgrade" above.)
	time.Sleep(1200 * time.Millisecond)
	if err := lkA.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	got, err := stock.Get("sh.helm.release.v1." + releaseName + ".v1")
	if err != nil {
		t.Fatal(err)
	}
	r := got.(*rspb.Release)
	r.Version, r.Info.Status, r.Info.Description = 2, common.StatusPendingUpgrade, "Preparing upgrade"
	if err := stock.Create("sh.helm.release.v1."+releaseName+".v2", r); err != nil {
		t.Fatal(err)
	}

	// A dies. B takes over and fails to recover (its context ends).
	lkB, err := b.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade, Wait: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if lkB.PreviousState != autorecover.LockExpired {
		t.Fatalf("B found %s, want A's expired lock", lkB.PreviousState)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lkB.Recover(ended, autorecover.Policy{}); err == nil {
		t.Fatal("B's Recover with an ended context succeeded")
	}
	if err := lkB.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(env.Summary(t, ns, releaseName), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after B's failed recovery = %s", got)
	}

	lkC, err := c.Acquire(ctx, autorecover.LockRequest{Release: releaseName, Namespace: ns, Operation: autorecover.OpUpgrade})
	if err != nil {
		t.Fatal(err)
	}
	releaseAtEnd(t, lkC)
	d, err := lkC.Recover(ctx, autorecover.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != autorecover.VerdictRecover || d.AbandonedBy == nil || d.AbandonedBy.Session != lkA.Session() || !equalInts(d.Marked, []int{2}) {
		t.Fatalf("C's recovery = %+v (%s)", d, d.Reason)
	}
	t.Logf("recovered: %s", d.Reason)
}
