package recovery

import (
	"context"
	"errors"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The objects of TestIntegrationDeferredRemovals (release dsRelease).
const (
	dsRelease  = "dsafe"
	dsBase     = dsRelease + "-base"         // ConfigMap in every revision
	dsAgain    = dsRelease + "-again"        // ConfigMap: abandoned and next, not deployed
	dsLB       = dsRelease + "-lb"           // LoadBalancer Service: abandoned and next
	dsDropped  = dsRelease + "-dropped"      // ConfigMap: abandoned only
	dsKeep     = dsRelease + "-dropped-keep" // ConfigMap: abandoned only, resource-policy keep
	dsClaim    = dsRelease + "-data"         // PersistentVolumeClaim: abandoned only
	dsManifest = `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dsafe-base
data:
  a: "1"
`
	dsAgainDoc = `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dsafe-again
data:
  a: "1"
  b: "only-abandoned"
---
apiVersion: v1
kind: Service
metadata:
  name: dsafe-lb
spec:
  type: LoadBalancer
  ports:
  - port: 80
`
	dsDroppedDoc = `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dsafe-dropped
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: dsafe-dropped-keep
  annotations:
    helm.sh/resource-policy: keep
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: dsafe-data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
`
)

// TestIntegrationDeferredRemovals is issue 11 item 1 at the level of the
// recovery package, on the real API server: before an upgrade, Converge
// deletes nothing the abandoned revision alone rendered (it defers it);
// RemoveDeferred then leaves everything while no newer revision exists,
// and once one does, removes only what it does not render, keeping what it
// renders again (same UIDs: a LoadBalancer Service, a ConfigMap), what is
// annotated keep, and a PersistentVolumeClaim unless DeleteData.
func TestIntegrationDeferredRemovals(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	store := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	put := func(rev int, st common.Status, manifest, method string) {
		t.Helper()
		r := helmRelease(dsRelease, ns, rev, st)
		r.Manifest, r.ApplyMethod = manifest, method
		if err := store.Create(helmx.ReleaseSecretName(dsRelease, rev), r); err != nil {
			t.Fatal(err)
		}
	}
	put(1, common.StatusDeployed, dsManifest, "csa")
	put(2, common.StatusPendingUpgrade, dsManifest+dsAgainDoc+dsDroppedDoc, "csa")

	// What revision 1 and the abandoned revision 2 applied, as helm does:
	// rendered objects with the ownership metadata, written by "helm".
	objs, err := parseManifest(dsManifest + dsAgainDoc + dsDroppedDoc)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := NewKube(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]types.UID{}
	for _, o := range objs {
		o = withOwnership(o, dsRelease, ns)
		m, err := kc.Mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		live, err := kc.Dynamic.Resource(m.Resource).Namespace(ns).Create(ctx, o, metav1.CreateOptions{FieldManager: HelmFieldManager})
		if err != nil {
			t.Fatal(err)
		}
		uids[o.GetKind()+"/"+o.GetName()] = live.GetUID()
	}
	kube := func() (*Kube, error) { return kc, nil }
	records := helmx.SecretRecords(env.Client)
	abandoned := revisionSummaryOf(t, env, ns, dsRelease, 2)

	writes := 0
	count := ConvergeOptions{DeferRemovals: true, BeforeWrite: func() error { writes++; return nil }}
	rep, err := ConvergeAbandoned(ctx, kube, records, abandoned, count)
	if err != nil {
		t.Fatalf("Converge: %v\n%s", err, rep.Summary())
	}
	t.Log(rep.Summary())
	if writes != 0 {
		t.Errorf("Converge before an upgrade wrote %d times; want none (nothing differs, removals deferred)", writes)
	}
	if rep.Deferred == nil || len(rep.Deferred.Refs) != 5 || rep.Deferred.RecordNamespace != ns {
		t.Fatalf("deferred %+v, want the 5 objects only revision 2 rendered", rep.Deferred)
	}
	for _, o := range rep.Objects {
		if o.Object.Name != dsBase && o.Action != ActionDeferred {
			t.Errorf("%s: %s, want deferred", o.Object, o.Action)
		}
	}
	checkUIDs(t, kc, ns, uids)

	// The operation wrote no revision: everything stays, and the error says so.
	rr, err := RemoveDeferred(ctx, kube, records, rep.Deferred, count)
	if !errors.Is(err, ErrNoNewRevision) || writes != 0 {
		t.Fatalf("RemoveDeferred with no new revision: %d writes, err %v", writes, err)
	}
	for _, name := range []string{dsDropped, dsClaim, dsLB} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error does not name %s: %v", name, err)
		}
	}
	t.Log(rr.Summary())
	checkUIDs(t, kc, ns, uids)

	// Revision 3 renders the ConfigMap (without the field only revision 2
	// set) and the LoadBalancer again, with client-side apply: helm adopts
	// the ConfigMap with its new rendering as the original and keeps field
	// b; RemoveDeferred removes it.
	put(3, common.StatusDeployed, dsManifest+strings.Replace(dsAgainDoc, "  b: \"only-abandoned\"\n", "", 1), "csa")
	rr, err = RemoveDeferred(ctx, kube, records, rep.Deferred, count)
	if err != nil {
		t.Fatalf("RemoveDeferred: %v\n%s", err, rr.Summary())
	}
	t.Log(rr.Summary())
	if rr.After != 3 || writes != 2 {
		t.Errorf("after revision %d with %d writes; want revision 3, one patch and one delete", rr.After, writes)
	}
	if cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, dsAgain, metav1.GetOptions{}); err != nil || len(cm.Data) != 1 || cm.Data["a"] != "1" {
		t.Errorf("%s holds %v (%v); want only a=1, the field only the abandoned revision set removed", dsAgain, cm.Data, err)
	}
	want := map[string]ConvergeAction{dsAgain: ActionReverted, dsLB: ActionKept, dsDropped: ActionDeleted, dsKeep: ActionKept, dsClaim: ActionKept}
	for _, o := range rr.Objects {
		if want[o.Object.Name] != o.Action {
			t.Errorf("%s: %s (%s), want %s", o.Object, o.Action, o.Reason, want[o.Object.Name])
		}
		if o.Object.Name == dsClaim && !strings.Contains(o.Reason, "--recover-delete-data") {
			t.Errorf("the claim is kept for %q; want the data-holder reason", o.Reason)
		}
	}
	delete(uids, "ConfigMap/"+dsDropped)
	checkUIDs(t, kc, ns, uids)
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, dsDropped, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s survives: %v", dsDropped, err)
	}

	// --recover-delete-data: the claim goes too (its deletion is at least
	// under way: the pvc-protection finalizer may hold it a moment).
	// The consent is the recovery's that left them (Deferred.DeleteData),
	// not the flag of the operation that removes them.
	withData := count
	withData.DeleteData = true
	if rr, err := RemoveDeferred(ctx, kube, records, rep.Deferred, withData); err != nil || rr.Changed() {
		t.Fatalf("RemoveDeferred with the operation's DeleteData only: %v\n%s", err, rr.Summary())
	}
	consented := *rep.Deferred
	consented.DeleteData = true
	rr, err = RemoveDeferred(ctx, kube, records, &consented, count)
	if err != nil {
		t.Fatalf("RemoveDeferred --recover-delete-data: %v", err)
	}
	t.Log(rr.Summary())
	pvc, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, dsClaim, metav1.GetOptions{})
	if err == nil && pvc.DeletionTimestamp == nil {
		t.Errorf("with DeleteData the claim is not deleted: %s", rr.Summary())
	}
	delete(uids, "PersistentVolumeClaim/"+dsClaim)
	checkUIDs(t, kc, ns, uids)
}

// checkUIDs: every object still exists with the UID it was created with
// (never deleted and created again).
func checkUIDs(t *testing.T, kc *Kube, ns string, uids map[string]types.UID) {
	t.Helper()
	for key, uid := range uids {
		kind, name, _ := strings.Cut(key, "/")
		m, err := kc.Mapper.RESTMapping(schema.GroupKind{Kind: kind}, "v1")
		if err != nil {
			t.Fatal(err)
		}
		live, err := kc.Dynamic.Resource(m.Resource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("%s: %v", key, err)
		case live.GetUID() != uid || live.GetDeletionTimestamp() != nil:
			t.Errorf("%s was deleted (UID %s, was %s; deletionTimestamp %v)", key, live.GetUID(), uid, live.GetDeletionTimestamp())
		}
	}
}

func revisionSummaryOf(t *testing.T, env *testenv.Env, ns, rel string, rev int) helmx.Summary {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), helmx.ReleaseSecretName(rel, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := helmx.Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}
