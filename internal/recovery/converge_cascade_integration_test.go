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
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// Only the abandoned revision renders these.
	cascAbandoned = `---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: casc-db
spec:
  serviceName: casc-db
  replicas: 1
  persistentVolumeClaimRetentionPolicy:
    whenDeleted: Delete
    whenScaled: Retain
  selector:
    matchLabels: {app: casc-db}
  template:
    metadata:
      labels: {app: casc-db}
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
---
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

// cascCRD installs a namespaced CRD of group <ns>.example.com, kind
// PGCluster (what a database operator's CRD looks like), and returns its
// group; it is removed when the test ends.
func cascCRD(t *testing.T, env *testenv.Env, ns string) string {
	t.Helper()
	ctx := context.Background()
	group := ns + ".example.com"
	ax, err := apiextclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "pgclusters." + group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "pgclusters", Singular: "pgcluster", Kind: "PGCluster", ListKind: "PGClusterList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: new(true),
				}},
			}},
		},
	}
	if _, err := ax.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ax.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	waitFor(t, time.Minute, "the CRD to be established", func() (bool, string) {
		c, err := ax.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %v", c.Status.Conditions)
	})
	return group
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
	group := cascCRD(t, env, ns)
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
	put(2, common.StatusPendingUpgrade, cascBase+cascAbandoned+cr)

	kc, err := NewKube(env.Config) // after the CRD: its mapper finds the kind
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifest(cascBase + cascAbandoned + cr)
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
	pgClaim, err := core.PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "casc-pg-data",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: mid.Name, UID: mid.UID}},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{FieldManager: "pg-operator"})
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
