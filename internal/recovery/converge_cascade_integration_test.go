package recovery

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The objects of TestIntegrationCascadeKept (release cascRelease).
const (
	cascRelease = "casc"
	cascBase    = `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: casc-base
`
	// Only the abandoned revision renders these, with the StatefulSet
	// casc-db of cascDB.
	cascAbandoned = `---
apiVersion: v1
kind: Service
metadata:
  name: casc-lb
spec:
  type: LoadBalancer
  ports:
  - port: 80
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: casc-plain
`
)

// statefulSetManifest renders a StatefulSet with one claim per replica
// (volumeClaimTemplates "data") and the claim retention policy given.
func statefulSetManifest(name string, replicas int, whenDeleted, whenScaled string) string {
	return fmt.Sprintf(`---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: %[1]s
spec:
  serviceName: %[1]s
  podManagementPolicy: Parallel
  replicas: %[2]d
  persistentVolumeClaimRetentionPolicy:
    whenDeleted: %[3]s
    whenScaled: %[4]s
  selector:
    matchLabels: {app: %[1]s}
  template:
    metadata:
      labels: {app: %[1]s}
    spec:
      containers:
      - name: db
        image: registry.example/db:1.0
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
`, name, replicas, whenDeleted, whenScaled)
}

// TestIntegrationCascadeKept is issue 31 item 1 on the real API server, its
// garbage collector and its StatefulSet controller: recovery never deletes
// an object whose deletion would take a PersistentVolumeClaim with it, nor
// a LoadBalancer Service, without DeleteData:
//   - a StatefulSet with persistentVolumeClaimRetentionPolicy.whenDeleted:
//     Delete, whose controller made its claim and set itself as the claim's
//     owner;
//   - a custom resource that owns, through an object of its operator, a
//     claim (ownerReferences set as operators set them);
//   - a LoadBalancer Service.
//
// A plain ConfigMap only the abandoned revision rendered is deleted. The
// objects left in place are recorded on the revision marked failed
// (MarkFailedLeaving) and read back from it (LoadLeft); removal against
// the next revision keeps the same objects. Every claim keeps its UID.
func TestIntegrationCascadeKept(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	group := ns + ".example.com"
	env.InstallCRD(t, group, "pgclusters", "PGCluster", apiextv1.NamespaceScoped, nil)
	cr := fmt.Sprintf(`---
apiVersion: %s/v1
kind: PGCluster
metadata:
  name: casc-pg
spec:
  instances: 1
`, group)
	store := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	put := func(rev int, st common.Status, manifest string) {
		t.Helper()
		r := helmRelease(cascRelease, ns, rev, st)
		r.Manifest, r.ApplyMethod = manifest, "csa"
		if err := store.Create(helmx.ReleaseSecretName(cascRelease, rev), r); err != nil {
			t.Fatal(err)
		}
	}
	put(1, common.StatusDeployed, cascBase)
	// A StatefulSet whose claims go when it is deleted.
	cascDB := statefulSetManifest("casc-db", 1, "Delete", "Retain")
	put(2, common.StatusPendingUpgrade, cascBase+cascDB+cascAbandoned+cr)

	kc, err := NewKube(env.Config) // after the CRD: its mapper finds the kind
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifest(cascBase + cascDB + cascAbandoned + cr)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		o = withOwnership(o, cascRelease, ns)
		m, err := kc.Mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		l, err := kc.Dynamic.Resource(m.Resource).Namespace(ns).Create(ctx, o, metav1.CreateOptions{FieldManager: HelmFieldManager})
		if err != nil {
			t.Fatal(err)
		}
		live[o.GetKind()+"/"+o.GetName()] = l
	}

	// The operator of PGCluster: an object of its own, owned by the
	// cluster resource, owns the claim (two levels of ownerReferences).
	pg := live["PGCluster/casc-pg"]
	core := env.Client.CoreV1()
	mid, err := core.ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:            "casc-pg-state",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: group + "/v1", Kind: "PGCluster", Name: pg.GetName(), UID: pg.GetUID()}},
	}}, metav1.CreateOptions{FieldManager: "pg-operator"})
	if err != nil {
		t.Fatal(err)
	}
	pgClaim, err := core.PersistentVolumeClaims(ns).Create(ctx,
		testenv.Claim("casc-pg-data", metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: mid.Name, UID: mid.UID}),
		metav1.CreateOptions{FieldManager: "pg-operator"})
	if err != nil {
		t.Fatal(err)
	}
	// The StatefulSet controller makes the claim of pod 0 and, with
	// whenDeleted: Delete, names the StatefulSet its owner.
	sts := live["StatefulSet/casc-db"]
	var stsClaim *corev1.PersistentVolumeClaim
	waitFor(t, 2*time.Minute, "the StatefulSet's claim, owned by it", func() (bool, string) {
		c, err := core.PersistentVolumeClaims(ns).Get(ctx, "data-casc-db-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, o := range c.OwnerReferences {
			if o.UID == sts.GetUID() {
				stsClaim = c
				return true, ""
			}
		}
		return false, fmt.Sprintf("owners %v", c.OwnerReferences)
	})
	claims := map[string]types.UID{pgClaim.Name: pgClaim.UID, stsClaim.Name: stsClaim.UID}

	kube := func() (*Kube, error) { return kc, nil }
	records := helmx.SecretRecords(env.Client)
	abandoned := revisionSummaryOf(t, env, ns, cascRelease, 2)

	// Recovery with no operation after it (recover, unlock, the
	// controller): everything waits, and is recorded on the revision.
	rep, err := ConvergeAbandoned(ctx, kube, records, abandoned, ConvergeOptions{DeferRemovals: true})
	if err != nil {
		t.Fatalf("Converge: %v\n%s", err, rep.Summary())
	}
	if rep.Deferred == nil || len(rep.Deferred.Refs) != 4 {
		t.Fatalf("deferred %+v; want the 4 objects only revision 2 rendered", rep.Deferred)
	}
	if _, err := MarkFailedLeaving(ctx, records, ns, abandoned, "", "abandoned", time.Time{}, rep.Deferred); err != nil {
		t.Fatal(err)
	}
	marked := revisionSummaryOf(t, env, ns, cascRelease, 2)
	if marked.Status != common.StatusFailed || marked.Left == "" {
		t.Fatalf("revision 2 is %s and records %q; want failed, with what was left", marked.Status, marked.Left)
	}
	left, err := LoadLeft(ctx, records, marked)
	if err != nil {
		t.Fatal(err)
	}
	if left.Names() != rep.Deferred.Names() || left.Abandoned != 2 || !left.AbandonedCreated.Equal(rep.Deferred.AbandonedCreated) {
		t.Fatalf("read back %q (revision %d, %s); recorded %q (%s)", left.Names(), left.Abandoned, left.AbandonedCreated, rep.Deferred.Names(), rep.Deferred.AbandonedCreated)
	}

	// The next upgrade renders the base only.
	put(3, common.StatusDeployed, cascBase)
	rr, err := RemoveDeferred(ctx, kube, records, left, ConvergeOptions{})
	if err != nil {
		t.Fatalf("RemoveDeferred: %v\n%s", err, rr.Summary())
	}
	t.Log(rr.Summary())
	want := map[string]struct {
		action ConvergeAction
		reason string
	}{
		"casc-db":    {ActionKept, "whenDeleted is Delete"},
		"casc-pg":    {ActionKept, "PersistentVolumeClaim " + ns + "/casc-pg-data (ownerReferences)"},
		"casc-lb":    {ActionKept, "LoadBalancer"},
		"casc-plain": {ActionDeleted, ""},
	}
	for _, o := range rr.Objects {
		w := want[o.Object.Name]
		if o.Action != w.action || !strings.Contains(o.Reason, w.reason) {
			t.Errorf("%s: %s (%s); want %s (%s)", o.Object, o.Action, o.Reason, w.action, w.reason)
		}
		if o.Action == ActionKept && !strings.Contains(o.Reason, "--recover-delete-data") {
			t.Errorf("%s is kept for %q, which does not say how to delete it", o.Object, o.Reason)
		}
	}
	if _, err := core.ConfigMaps(ns).Get(ctx, "casc-plain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap casc-plain survives: %v", err)
	}
	// The owners are there, not being deleted, so the garbage collector
	// leaves the claims; and the claims are the very same.
	for key, o := range live {
		if key == "ConfigMap/casc-plain" {
			continue
		}
		gvk := o.GroupVersionKind()
		m, err := kc.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		now, err := kc.Dynamic.Resource(m.Resource).Namespace(ns).Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil || now.GetUID() != o.GetUID() || now.GetDeletionTimestamp() != nil {
			t.Errorf("%s was deleted (err %v)", key, err)
		}
	}
	checkClaims(t, env, ns, claims)

	// Converge with nothing deferred (before helm's rollback, whose target
	// is known) applies the same rules: put revision 2 back to pending.
	t.Run("converge", func(t *testing.T) {
		if err := env.Client.CoreV1().Secrets(ns).Delete(ctx, helmx.ReleaseSecretName(cascRelease, 3), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rep, err := Converge(ctx, kc, ConvergeInput{Abandoned: mustDecode(t, env, ns, 2), AbandonedCreated: abandoned.CreationTimestamp, Base: mustDecode(t, env, ns, 1)}, ConvergeOptions{})
		if err != nil {
			t.Fatalf("Converge: %v\n%s", err, rep.Summary())
		}
		for _, o := range rep.Objects {
			if o.Action == ActionDeleted {
				t.Errorf("%s was deleted", o.Object)
			}
		}
		checkClaims(t, env, ns, claims)
		// --recover-delete-data lifts it: the StatefulSet goes.
		rep, err = Converge(ctx, kc, ConvergeInput{Abandoned: mustDecode(t, env, ns, 2), AbandonedCreated: abandoned.CreationTimestamp, Base: mustDecode(t, env, ns, 1)}, ConvergeOptions{DeleteData: true})
		if err != nil {
			t.Fatalf("Converge --recover-delete-data: %v\n%s", err, rep.Summary())
		}
		gone := map[string]bool{}
		for _, o := range rep.Objects {
			gone[o.Object.Name] = o.Action == ActionDeleted
		}
		if !gone["casc-db"] || !gone["casc-pg"] || !gone["casc-lb"] {
			t.Errorf("with DeleteData: %s", rep.Summary())
		}
	})
}

func mustDecode(t *testing.T, env *testenv.Env, ns string, rev int) *rspb.Release {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), helmx.ReleaseSecretName(cascRelease, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeRelease(s.Data[helmx.ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkClaims: every claim exists with its UID and is not being deleted.
func checkClaims(t *testing.T, env *testenv.Env, ns string, claims map[string]types.UID) {
	t.Helper()
	for name, uid := range claims {
		c, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("claim %s: %v", name, err)
		case c.UID != uid || c.DeletionTimestamp != nil:
			t.Errorf("claim %s was deleted (UID %s, was %s; deletionTimestamp %v)", name, c.UID, uid, c.DeletionTimestamp)
		}
	}
}

// putRevision stores revision rev of release rel in ns with helm's own
// driver, with status st and manifest.
func putRevision(t *testing.T, env *testenv.Env, ns, rel string, rev int, st common.Status, manifest string) {
	t.Helper()
	r := helmRelease(rel, ns, rev, st)
	r.Manifest, r.ApplyMethod = manifest, "csa"
	if err := driver.NewSecrets(env.Client.CoreV1().Secrets(ns)).Create(helmx.ReleaseSecretName(rel, rev), r); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationCascadeClusterScopedOwner: a cluster-scoped custom
// resource (a tenant) that owns a Namespace, with a claim in it, and a CRD
// is kept: the garbage collector would take both with it. Found by the
// adversarial review: the walk started from claims, StatefulSets and
// Services only, and the tenant was deleted.
func TestIntegrationCascadeClusterScopedOwner(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	group := ns + ".example.com"
	env.InstallCRD(t, group, "tenants", "Tenant", apiextv1.ClusterScoped, nil)
	const rel = "tn"
	base := "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tn-base\n"
	tenant := fmt.Sprintf("---\napiVersion: %s/v1\nkind: Tenant\nmetadata:\n  name: %s-t1\n", group, ns)
	putRevision(t, env, ns, rel, 1, common.StatusDeployed, base)
	putRevision(t, env, ns, rel, 2, common.StatusPendingUpgrade, base+tenant)
	kc, err := NewKube(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifest(tenant)
	if err != nil {
		t.Fatal(err)
	}
	tenants := kc.Dynamic.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "tenants"})
	liveT, err := tenants.Create(ctx, withOwnership(objs[0], rel, ns), metav1.CreateOptions{FieldManager: HelmFieldManager})
	if err != nil {
		t.Fatal(err)
	}
	owner := []metav1.OwnerReference{{APIVersion: group + "/v1", Kind: "Tenant", Name: liveT.GetName(), UID: liveT.GetUID()}}
	// The tenant's operator: a Namespace it owns, a claim in it, and a CRD
	// it owns (as Crossplane's ProviderRevision owns its CRDs).
	tns, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-tenant", OwnerReferences: owner}}, metav1.CreateOptions{FieldManager: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), tns.Name, metav1.DeleteOptions{})
	})
	claim, err := env.Client.CoreV1().PersistentVolumeClaims(tns.Name).Create(ctx, testenv.Claim("data"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.InstallCRD(t, "w"+group, "widgets", "Widget", apiextv1.ClusterScoped, owner)

	records := helmx.SecretRecords(env.Client)
	kube := func() (*Kube, error) { return kc, nil }
	abandoned := revisionSummaryOf(t, env, ns, rel, 2)
	rep, err := ConvergeAbandoned(ctx, kube, records, abandoned, ConvergeOptions{DeferRemovals: true})
	if err != nil {
		t.Fatal(err)
	}
	putRevision(t, env, ns, rel, 3, common.StatusDeployed, base)
	rr, err := RemoveDeferred(ctx, kube, records, rep.Deferred, ConvergeOptions{})
	if err != nil {
		t.Fatalf("RemoveDeferred: %v\n%s", err, rr.Summary())
	}
	t.Log(rr.Summary())
	if len(rr.Objects) != 1 || rr.Objects[0].Action != ActionKept || !strings.Contains(rr.Objects[0].Reason, "Namespace "+tns.Name) && !strings.Contains(rr.Objects[0].Reason, "CustomResourceDefinition") {
		t.Errorf("the tenant: %+v; want kept, naming the Namespace or the CRD it owns", rr.Objects)
	}
	// The owner stands, so the garbage collector takes nothing.
	if l, err := tenants.Get(ctx, liveT.GetName(), metav1.GetOptions{}); err != nil || l.GetDeletionTimestamp() != nil || l.GetUID() != liveT.GetUID() {
		t.Errorf("the tenant was deleted (%v)", err)
	}
	checkClaims(t, env, tns.Name, map[string]types.UID{claim.Name: claim.UID})
}

// TestIntegrationRevertKeepsScaledClaims: reverting a StatefulSet's
// replicas from 2 to 1 would make its controller delete the claim of
// replica 1 (whenScaled: Delete), before the upgrade that may scale it to
// 2 again: the revert is not made (found by the adversarial review).
func TestIntegrationRevertKeepsScaledClaims(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	const rel = "rs"
	sts := func(replicas int) string { return statefulSetManifest("rs-db", replicas, "Retain", "Delete") }
	putRevision(t, env, ns, rel, 1, common.StatusDeployed, sts(1))
	putRevision(t, env, ns, rel, 2, common.StatusPendingUpgrade, sts(2))
	kc, err := NewKube(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifest(sts(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "rs-db", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("rs-db exists already: %v", err)
	}
	res := kc.Dynamic.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}).Namespace(ns)
	if _, err := res.Create(ctx, withOwnership(objs[0], rel, ns), metav1.CreateOptions{FieldManager: HelmFieldManager}); err != nil {
		t.Fatal(err)
	}
	var claim *corev1.PersistentVolumeClaim
	waitFor(t, 2*time.Minute, "the claim of replica 1", func() (bool, string) {
		c, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-rs-db-1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim = c
		return true, ""
	})
	kube := func() (*Kube, error) { return kc, nil }
	rep, err := ConvergeAbandoned(ctx, kube, helmx.SecretRecords(env.Client), revisionSummaryOf(t, env, ns, rel, 2), ConvergeOptions{DeferRemovals: true})
	if err != nil {
		t.Fatalf("Converge: %v\n%s", err, rep.Summary())
	}
	t.Log(rep.Summary())
	if len(rep.Objects) != 1 || rep.Objects[0].Action != ActionKept || !strings.Contains(rep.Objects[0].Reason, "from 2 to 1 replicas") {
		t.Errorf("the StatefulSet: %+v; want kept, not scaled down", rep.Objects)
	}
	if s, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "rs-db", metav1.GetOptions{}); err != nil || s.Spec.Replicas == nil || *s.Spec.Replicas != 2 {
		t.Errorf("the StatefulSet was scaled down (%v)", err)
	}
	checkClaims(t, env, ns, map[string]types.UID{claim.Name: claim.UID})
}
