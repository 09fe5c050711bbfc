package controller

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"helm.sh/helm/v4/pkg/release/common"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

var rt0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func fixtureRevision(t *testing.T, rev int, status common.Status, created time.Time) *corev1.Secret {
	t.Helper()
	doc, err := json.Marshal(map[string]any{
		"name": "web", "namespace": "shop", "version": rev,
		"info":     map[string]any{"status": status, "description": "fixture"},
		"chart":    map[string]any{"metadata": map[string]any{"name": "app", "version": "0.1.0"}},
		"manifest": "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := helmx.EncodeReleaseJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: helmx.ReleaseSecretName("web", rev), Namespace: "shop", ResourceVersion: "10",
			CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{
				helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelName: "web", helmx.LabelVersion: strconv.Itoa(rev),
				helmx.LabelStatus: string(status),
			},
		},
		Type: helmx.ReleaseSecretType,
		Data: map[string][]byte{helmx.ReleaseDataKey: payload},
	}
}

// metaCache is a metadata cache of pending records: it lists what it holds
// (the namespace and label filters are not applied: one release per test).
type metaCache struct {
	items []metav1.PartialObjectMetadata
}

func (metaCache) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("not cached")
}

func (c metaCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if l, ok := list.(*metav1.PartialObjectMetadataList); ok {
		l.Items = append(l.Items[:0], c.items...)
	}
	return nil
}

// cached is the metadata of records, as the controller's cache holds them.
func cached(objs ...*corev1.Secret) metaCache {
	var c metaCache
	for _, o := range objs {
		c.items = append(c.items, metav1.PartialObjectMetadata{ObjectMeta: o.ObjectMeta})
	}
	return c
}

// TestSelectorIncludesUninstalling: an uninstall killed mid-way leaves its
// revision "uninstalling", pending for the protocol: the controller watches
// it like the pending-* statuses, and nothing else of helm's.
func TestSelectorIncludesUninstalling(t *testing.T) {
	sel, err := recordSelector("team=web")
	if err != nil {
		t.Fatal(err)
	}
	for status, want := range map[string]bool{
		"pending-install": true, "pending-upgrade": true, "pending-rollback": true, "uninstalling": true,
		"deployed": false, "failed": false, "superseded": false, "uninstalled": false,
	} {
		l := labels.Set{helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelStatus: status, "team": "web"}
		if got := sel.Matches(l); got != want {
			t.Errorf("status %s: watched = %v, want %v", status, got, want)
		}
	}
	if sel.Matches(labels.Set{helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelStatus: "uninstalling", "team": "db"}) {
		t.Error("--selector not applied")
	}
}

// TestFailedRecoveryBacksOff: a recovery that fails after the lock was
// taken (converge refused) rewrites the watched record (the lock's take and
// release), whose events bring the release straight back: the reconciler
// itself waits out its backoff, writing nothing until then.
// stuckFixture is a reconciler over release shop/web: revision 1 deployed
// two hours ago, revision 2 pending an upgrade for an hour (past the legacy
// threshold), with no lock; converge cannot reach the cluster (it stands
// for a forbidden patch), so a recovery fails after its lock is taken.
func stuckFixture(t *testing.T, opts Options) (*Reconciler, *fake.Clientset, *clocktesting.FakeClock, *corev1.Secret) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	deployed := fixtureRevision(t, 1, common.StatusDeployed, rt0.Add(-2*time.Hour))
	pending := fixtureRevision(t, 2, common.StatusPendingUpgrade, rt0.Add(-time.Hour))
	cs := fake.NewClientset(ns, deployed, pending)
	clk := clocktesting.NewFakeClock(rt0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), rt0)
	conn := protocol.NewConn(cs, est, clk, "", func() (*recovery.Kube, error) {
		return nil, errors.New("converge cannot reach the cluster (stands for a forbidden patch)")
	})
	opts.LockBackend, opts.Who = "release", "controller@test"
	opts.Policy.Autorecover, opts.Policy.LegacyAfter, opts.Policy.Hints = true, 15*time.Minute, recovery.CLIHints
	r := &Reconciler{
		Conn: conn, Cache: cached(pending), Options: opts,
		metrics: newMetrics(prometheus.NewRegistry()), kind: "Secret", Clock: clk,
	}
	return r, cs, clk, pending
}

func TestFailedRecoveryBacksOff(t *testing.T) {
	r, cs, clk, pending := stuckFixture(t, Options{})
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "shop", Name: "web"}}
	writes := func() int {
		n := 0
		for _, a := range cs.Actions() {
			switch a.GetVerb() {
			case "create", "update", "patch", "delete":
				n++
			}
		}
		return n
	}
	res, err := r.Reconcile(t.Context(), req)
	if err != nil || res.RequeueAfter != backoffFirst {
		t.Fatalf("first failed recovery: %+v, %v; want a retry after %s", res, err, backoffFirst)
	}
	if writes() == 0 {
		t.Fatal("the first attempt wrote nothing: the fixture does not fail after the lock is taken")
	}
	// The events of those writes bring it back at once: nothing happens.
	cs.ClearActions()
	for range 5 {
		res, err = r.Reconcile(t.Context(), req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > backoffFirst {
			t.Fatalf("attempt during the backoff: %+v, %v", res, err)
		}
	}
	if n := writes(); n != 0 {
		t.Errorf("%d writes during the backoff; want none", n)
	}
	// Once the backoff has passed, the release is attempted again, and a
	// second failure waits twice as long.
	clk.Step(backoffFirst)
	res, err = r.Reconcile(t.Context(), req)
	if err != nil || res.RequeueAfter != 2*backoffFirst {
		t.Fatalf("attempt after the backoff: %+v, %v; want a retry after %s", res, err, 2*backoffFirst)
	}
	if writes() == 0 {
		t.Error("no attempt after the backoff had passed")
	}
	if got := r.failed("shop/web"); got != 4*backoffFirst {
		t.Errorf("third failure waits %s, want %s", got, 4*backoffFirst)
	}
	if st, _ := cs.CoreV1().Secrets("shop").Get(t.Context(), pending.Name, metav1.GetOptions{}); st.Labels[helmx.LabelStatus] != "pending-upgrade" {
		t.Errorf("status %s: a failed recovery marked the revision", st.Labels[helmx.LabelStatus])
	}
}

var _ client.Reader = metaCache{}

// TestSkipReadsNothing: a release whose records left pending (every helm
// operation ends so, and the cache's delete event brings it here), and one
// that opted out, cost no request to the API server; a namespace being
// deleted is not judged either.
func TestSkipReadsNothing(t *testing.T) {
	deployed := fixtureRevision(t, 1, common.StatusDeployed, rt0.Add(-2*time.Hour))
	pending := fixtureRevision(t, 2, common.StatusPendingUpgrade, rt0.Add(-time.Hour))
	optedOut := pending.DeepCopy()
	optedOut.Labels[AnnotationIgnore] = "true"
	live := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	terminating := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
	for _, c := range []struct {
		name     string
		ns       *corev1.Namespace
		cache    metaCache
		requests int
	}{
		{"left pending", live, cached(), 0},
		{"opted out", live, cached(optedOut), 0},
		{"namespace being deleted", terminating, cached(pending), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := fake.NewClientset(c.ns, deployed, pending)
			clk := clocktesting.NewFakeClock(rt0)
			est := servertime.New(clk)
			est.Observe(clk.Now(), clk.Now(), rt0)
			r := &Reconciler{
				Conn:    protocol.NewConn(cs, est, clk, "", nil),
				Cache:   c.cache,
				Options: Options{LockBackend: "release", Policy: recovery.Policy{Autorecover: true, LegacyAfter: time.Minute}, Who: "controller@test"},
				metrics: newMetrics(prometheus.NewRegistry()),
				kind:    "Secret",
				Clock:   clk,
			}
			res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "shop", Name: "web"}})
			if err != nil || res.RequeueAfter != 0 {
				t.Fatalf("Reconcile = %+v, %v; want done", res, err)
			}
			if n := len(cs.Actions()); n != c.requests {
				t.Errorf("%d requests (%v), want %d", n, cs.Actions(), c.requests)
			}
		})
	}
}
