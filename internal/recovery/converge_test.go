package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func TestConvergeMethod(t *testing.T) {
	cases := map[string]ApplyMethod{
		"":        ClientSideApply, // helm 3, and helm 4 revisions of helm 3 releases
		"csa":     ClientSideApply,
		"ssa":     ServerSideApply,
		"unknown": ClientSideApply, // helm treats anything but "ssa" as client-side
	}
	for in, want := range cases {
		if got := ConvergeMethod(&rspb.Release{ApplyMethod: in}); got != want {
			t.Errorf("ConvergeMethod(%q) = %q, want %q", in, got, want)
		}
	}
	if got := ConvergeMethod(nil); got != ClientSideApply {
		t.Errorf("ConvergeMethod(nil) = %q", got)
	}
}

// A manifest as helm stores it: "# Source" comments, empty documents, a List.
const helmManifest = `
---
# Source: app/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
data:
  message: "hello"
---
# Source: app/templates/empty.yaml
---
# Source: app/templates/list.yaml
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: web-a
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: web-b
    namespace: other
---
# Source: app/templates/role.yaml
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: web-reader
`

func TestParseManifest(t *testing.T) {
	objs, err := parseManifest(helmManifest)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
	}
	want := "ConfigMap//web-config ConfigMap//web-a ConfigMap/other/web-b ClusterRole//web-reader"
	if strings.Join(got, " ") != want {
		t.Errorf("objects %v, want %s", got, want)
	}

	for _, bad := range []string{"kind: ConfigMap\nmetadata:\n  name: x\n", "apiVersion: v1\nkind: ConfigMap\n", "a: [b"} {
		if _, err := parseManifest(bad); err == nil {
			t.Errorf("parseManifest(%q) succeeded", bad)
		}
	}
	if objs, err := parseManifest(""); err != nil || len(objs) != 0 {
		t.Errorf("empty manifest: %v, %v", objs, err)
	}
}

func res(apiVersion, kind, ns, name string, fields map[string]any) resolved {
	obj := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"name": name}}
	for k, v := range fields {
		obj[k] = v
	}
	return resolved{obj: &unstructured.Unstructured{Object: obj}, ref: ObjectRef{APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name}}
}

func TestPlan(t *testing.T) {
	abandoned := []resolved{
		res("v1", "ConfigMap", "shop", "web-config", nil),
		res("v1", "ConfigMap", "shop", "web-extra", nil),
		res("apps/v1", "Deployment", "shop", "web", nil),
		res("v1", "Service", "shop", "web-new", nil),
		res("v1", "ConfigMap", "other", "web-config", nil), // same name, another namespace
	}
	base := []resolved{
		res("apps/v1", "Deployment", "shop", "web", nil),
		res("v1", "ConfigMap", "shop", "web-config", nil),
		res("v1", "ConfigMap", "shop", "web-old", nil), // only deployed: never recreated
		res("autoscaling/v2", "HorizontalPodAutoscaler", "shop", "web", nil),
	}
	// The version does not matter for matching, as in helm.
	abandoned = append(abandoned, res("autoscaling/v1", "HorizontalPodAutoscaler", "shop", "web", nil))

	p := plan(abandoned, base)
	var both, only []string
	for _, pr := range p.Both {
		if pr.Abandoned.key() != pr.Base.key() {
			t.Errorf("pair of different objects: %v / %v", pr.Abandoned.ref, pr.Base.ref)
		}
		both = append(both, pr.Base.ref.String())
	}
	for _, o := range p.OnlyAbandoned {
		only = append(only, o.ref.String())
	}
	if got, want := strings.Join(both, ", "), "Deployment shop/web, ConfigMap shop/web-config, HorizontalPodAutoscaler shop/web"; got != want {
		t.Errorf("both: %s\nwant: %s", got, want)
	}
	// Reverse manifest order.
	if got, want := strings.Join(only, ", "), "ConfigMap other/web-config, Service shop/web-new, ConfigMap shop/web-extra"; got != want {
		t.Errorf("only abandoned: %s\nwant: %s", got, want)
	}
}

func TestObjNamespace(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "x"}}}
	if got := objNamespace(u, true, "rel-ns"); got != "rel-ns" {
		t.Errorf("namespaced, none given: %q", got)
	}
	u.SetNamespace("own")
	if got := objNamespace(u, true, "rel-ns"); got != "own" {
		t.Errorf("namespaced, own: %q", got)
	}
	if got := objNamespace(u, false, "rel-ns"); got != "" {
		t.Errorf("cluster-scoped: %q", got)
	}
}

func deployment(nodeSelector map[string]any, replicas int64) *unstructured.Unstructured {
	spec := map[string]any{"containers": []any{map[string]any{"name": "app", "image": "app:1"}}}
	if nodeSelector != nil {
		spec["nodeSelector"] = nodeSelector
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web"},
		"spec": map[string]any{
			"replicas": replicas,
			"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "web"}},
				"spec":     spec,
			},
		},
	}}
}

func apply(t *testing.T, live *unstructured.Unstructured, patch []byte) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatal(err)
	}
	out := live.DeepCopy().Object
	var merge func(dst, src map[string]any)
	merge = func(dst, src map[string]any) {
		for k, v := range src {
			if v == nil {
				delete(dst, k)
				continue
			}
			if sm, ok := v.(map[string]any); ok {
				if dm, ok := dst[k].(map[string]any); ok {
					merge(dm, sm)
					continue
				}
			}
			dst[k] = v
		}
	}
	merge(out, p)
	return out
}

func TestThreeWayPatchRevertsTheAbandonedRevision(t *testing.T) {
	base := withOwnership(deployment(nil, 1), "web", "shop")
	abandoned := withOwnership(deployment(map[string]any{"never": "x"}, 2), "web", "shop")
	// Live: what the abandoned revision applied, plus another writer's
	// annotation and server fields.
	live := abandoned.DeepCopy()
	live.SetResourceVersion("42")
	live.SetUID(types.UID("u-1"))
	ann := live.GetAnnotations()
	ann["example.com/other-writer"] = "keep me"
	live.SetAnnotations(ann)
	_ = unstructured.SetNestedField(live.Object, map[string]any{"replicas": int64(2)}, "status")

	patch, pt, err := threeWayPatch(abandoned, base, live)
	if err != nil {
		t.Fatal(err)
	}
	if pt != types.StrategicMergePatchType {
		t.Errorf("patch type %s for a Deployment, want strategic merge", pt)
	}
	t.Logf("patch: %s", patch)
	got := &unstructured.Unstructured{Object: apply(t, live, patch)}
	if ns, found, _ := unstructured.NestedMap(got.Object, "spec", "template", "spec", "nodeSelector"); found {
		t.Errorf("nodeSelector survives: %v", ns)
	}
	if r, _, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "replicas"); r != float64(1) {
		t.Errorf("replicas %v, want 1", r)
	}
	if got.GetAnnotations()["example.com/other-writer"] != "keep me" {
		t.Errorf("another writer's annotation was removed: %v", got.GetAnnotations())
	}
	if got.GetAnnotations()[AnnotationReleaseName] != "web" || got.GetLabels()[LabelManagedBy] != "Helm" {
		t.Errorf("ownership metadata lost: %v %v", got.GetAnnotations(), got.GetLabels())
	}

	// The same object never reached by the abandoned revision: nothing to do.
	patch, _, err = threeWayPatch(abandoned, base, base.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if patch != nil {
		t.Errorf("patch for an object already at the base: %s", patch)
	}
}

func TestThreeWayPatchCustomResource(t *testing.T) {
	mk := func(spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": "w"}, "spec": spec,
		}}
	}
	base := mk(map[string]any{"size": int64(1)})
	abandoned := mk(map[string]any{"size": int64(2), "color": "red"})
	live := abandoned.DeepCopy()
	_ = unstructured.SetNestedField(live.Object, "set by a controller", "spec", "observed")
	patch, pt, err := threeWayPatch(abandoned, base, live)
	if err != nil {
		t.Fatal(err)
	}
	if pt != types.MergePatchType {
		t.Errorf("patch type %s for a custom resource, want JSON merge", pt)
	}
	got := apply(t, live, patch)
	spec := got["spec"].(map[string]any)
	if _, ok := spec["color"]; ok || spec["size"] != float64(1) && spec["size"] != int64(1) || spec["observed"] != "set by a controller" {
		t.Errorf("spec after revert: %v (patch %s)", spec, patch)
	}
}

func TestWithResourceVersion(t *testing.T) {
	out, err := withResourceVersion([]byte(`{"metadata":{"labels":{"a":"b"}},"data":{"x":null}}`), "7")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"data":{"x":null},"metadata":{"labels":{"a":"b"},"resourceVersion":"7"}}`; string(out) != want {
		t.Errorf("got %s\nwant %s", out, want)
	}
	out, _ = withResourceVersion([]byte(`{"spec":{"replicas":1}}`), "8")
	if want := `{"metadata":{"resourceVersion":"8"},"spec":{"replicas":1}}`; string(out) != want {
		t.Errorf("got %s\nwant %s", out, want)
	}
	body, _ := applyBody(deployment(nil, 1), "9")
	if !strings.Contains(string(body), `"resourceVersion":"9"`) {
		t.Errorf("apply body without the precondition: %s", body)
	}
}

func liveObj(ann, labels map[string]string, created time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "web-extra"}}}
	u.SetAnnotations(ann)
	u.SetLabels(labels)
	u.SetCreationTimestamp(metav1.NewTime(created))
	return u
}

func TestKeepReason(t *testing.T) {
	revAt := t0
	owned := map[string]string{AnnotationReleaseName: "web", AnnotationReleaseNamespace: "shop"}
	helmLabel := map[string]string{LabelManagedBy: "Helm"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range m {
			out[a] = b
		}
		out[k] = v
		return out
	}
	rendered := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "web-extra"}}}
	renderedKeep := rendered.DeepCopy()
	renderedKeep.SetAnnotations(map[string]string{AnnotationResourcePolicy: "keep"})

	cases := []struct {
		name     string
		live     *unstructured.Unstructured
		rendered *unstructured.Unstructured
		created  time.Time
		want     string // "" = delete; otherwise a substring of the reason
	}{
		{"owned, created by the revision", liveObj(owned, helmLabel, revAt.Add(time.Second)), rendered, revAt, ""},
		{"created in the same second as the revision", liveObj(owned, helmLabel, revAt), rendered, revAt, ""},
		{"same second, written by helm only", managedBy(liveObj(owned, helmLabel, revAt), "helm"), rendered, revAt, ""},
		{"same second, also written by another manager", managedBy(liveObj(owned, helmLabel, revAt), "kubectl-create", "helm"), rendered, revAt, `field manager "kubectl-create"`},
		{"same second, a controller wrote its status", withStatusWriter(managedBy(liveObj(owned, helmLabel, revAt), "helm"), "kube-controller-manager"), rendered, revAt, ""},
		{"a second later, also written by another manager", managedBy(liveObj(owned, helmLabel, revAt.Add(time.Second)), "kubectl-edit", "helm"), rendered, revAt, ""},
		{"existed before (adopted)", liveObj(owned, helmLabel, revAt.Add(-time.Second)), rendered, revAt, "existed before the abandoned revision"},
		{"creation time of the revision unknown", liveObj(owned, helmLabel, revAt), rendered, time.Time{}, "unknown"},
		{"no annotations", liveObj(nil, helmLabel, revAt), rendered, revAt, "not owned by this release: annotation meta.helm.sh/release-name is \"\""},
		{"another release", liveObj(with(owned, AnnotationReleaseName, "shop"), helmLabel, revAt), rendered, revAt, `is "shop"`},
		{"same release name, another namespace", liveObj(with(owned, AnnotationReleaseNamespace, "other"), helmLabel, revAt), rendered, revAt, "release-namespace"},
		{"not managed by Helm", liveObj(owned, nil, revAt), rendered, revAt, "managed-by"},
		{"keep on the live object", liveObj(with(owned, AnnotationResourcePolicy, "keep"), helmLabel, revAt), rendered, revAt, "keep"},
		{"Keep, spaced", liveObj(with(owned, AnnotationResourcePolicy, " Keep "), helmLabel, revAt), rendered, revAt, "keep"},
		{"keep in the manifest only", liveObj(owned, helmLabel, revAt), renderedKeep, revAt, "keep"},
	}
	for _, c := range cases {
		got := keepReason(c.live, c.rendered, "web", "shop", c.created)
		switch {
		case c.want == "" && got != "":
			t.Errorf("%s: kept (%s), want deleted", c.name, got)
		case c.want != "" && !strings.Contains(got, c.want):
			t.Errorf("%s: reason %q, want it to contain %q", c.name, got, c.want)
		}
	}
}

// managedBy gives o a managedFields entry for each manager.
func managedBy(o *unstructured.Unstructured, managers ...string) *unstructured.Unstructured {
	var mf []metav1.ManagedFieldsEntry
	for _, m := range managers {
		mf = append(mf, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate})
	}
	o.SetManagedFields(mf)
	return o
}

// withStatusWriter adds a manager that wrote only the status subresource.
func withStatusWriter(o *unstructured.Unstructured, manager string) *unstructured.Unstructured {
	o.SetManagedFields(append(o.GetManagedFields(), metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}))
	return o
}

func TestConvergeWithoutDeployedRevision(t *testing.T) {
	ab := &rspb.Release{Name: "web", Namespace: "shop", Version: 1, ApplyMethod: "ssa", Manifest: helmManifest}
	rep, err := Converge(context.Background(), nil, ConvergeInput{Abandoned: ab, AbandonedCreated: t0}, ConvergeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped == "" || rep.Changed() || len(rep.Objects) != 0 {
		t.Errorf("report %+v, want skipped with no objects", rep)
	}
	if want := `release "web" in namespace "shop": revision 1 left as it is: no revision is deployed`; !strings.HasPrefix(rep.Summary(), want) {
		t.Errorf("summary %q", rep.Summary())
	}
	if _, err := Converge(context.Background(), nil, ConvergeInput{}, ConvergeOptions{}); err == nil {
		t.Error("Converge without an abandoned revision succeeded")
	}
}

func TestConvergeReportSummary(t *testing.T) {
	rep := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1, Method: ServerSideApply,
		Objects: []ObjectResult{
			{Object: ObjectRef{Kind: "Deployment", Namespace: "shop", Name: "web"}, Action: ActionReverted},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-config"}, Action: ActionInSync, Reason: "no field differs"},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-extra"}, Action: ActionDeleted},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-keep"}, Action: ActionKept, Reason: "helm.sh/resource-policy: keep"},
			{Object: ObjectRef{Kind: "ClusterRole", Name: "web-reader"}, Action: ActionFailed, Reason: "forbidden"},
		},
	}
	want := `release "web" in namespace "shop": undid what abandoned revision 2 applied, back to deployed revision 1 (server-side apply): ` +
		`reverted Deployment shop/web; deleted ConfigMap shop/web-extra; kept ConfigMap shop/web-keep (helm.sh/resource-policy: keep); failed ClusterRole web-reader (forbidden)`
	if got := rep.Summary(); got != want {
		t.Errorf("summary\n got %s\nwant %s", got, want)
	}
	if !rep.Changed() {
		t.Error("Changed() = false")
	}
	if !rep.Notable() {
		t.Error("Notable() = false")
	}
	quiet := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1,
		Objects: []ObjectResult{{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-config"}, Action: ActionInSync}},
	}
	if got := quiet.Summary(); !strings.HasSuffix(got, "(client-side apply): nothing to undo") || quiet.Changed() || quiet.Notable() {
		t.Errorf("quiet summary %q", got)
	}
	kept := ConvergeReport{Objects: []ObjectResult{{Action: ActionKept}}}
	if kept.Changed() || !kept.Notable() {
		t.Error("a kept object: want Notable and not Changed")
	}
}

func TestIsStale(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	if !isStale(apierrors.NewConflict(gr, "x", errors.New("the object has been modified"))) {
		t.Error("a resourceVersion conflict is not stale")
	}
	fieldConflict := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 409, Reason: metav1.StatusReasonConflict,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldManagerConflict, Field: ".data.x"}}},
	}}
	if isStale(fieldConflict) {
		t.Error("a field manager conflict is retried as stale")
	}
}

func TestLoadConvergeInput(t *testing.T) {
	ctx := context.Background()
	cs := newFake()
	d := driver.NewSecrets(cs.CoreV1().Secrets("shop"))
	store := func(v int, st common.Status, manifest, method string) {
		r := helmRelease("web", "shop", v, st)
		r.Manifest, r.ApplyMethod = manifest, method
		if err := d.Create(helmx.ReleaseSecretName("web", v), r); err != nil {
			t.Fatal(err)
		}
	}
	store(1, common.StatusSuperseded, "m1", "")
	store(2, common.StatusDeployed, "m2", "csa")
	store(3, common.StatusFailed, "m3", "ssa")
	store(4, common.StatusFailed, "m4", "ssa") // abandoned, already marked failed
	abandoned := helmx.Summary{RecordName: helmx.ReleaseSecretName("web", 4), RecordNamespace: "shop", Name: "web", Namespace: "shop", Revision: 4}

	in, err := LoadConvergeInput(ctx, helmx.SecretRecords(cs), abandoned)
	if err != nil {
		t.Fatal(err)
	}
	if in.Abandoned == nil || in.Abandoned.Version != 4 || in.Abandoned.Manifest != "m4" || ConvergeMethod(in.Abandoned) != ServerSideApply {
		t.Errorf("abandoned %+v", in.Abandoned)
	}
	if in.Base == nil || in.Base.Version != 2 || in.Base.Manifest != "m2" {
		t.Errorf("base %+v, want revision 2 (the deployed one)", in.Base)
	}

	// No deployed revision: no base.
	cs2 := newFake()
	d = driver.NewSecrets(cs2.CoreV1().Secrets("shop"))
	if err := d.Create(helmx.ReleaseSecretName("web", 1), helmRelease("web", "shop", 1, common.StatusFailed)); err != nil {
		t.Fatal(err)
	}
	one := abandoned
	one.RecordName, one.Revision = helmx.ReleaseSecretName("web", 1), 1
	in, err = LoadConvergeInput(ctx, helmx.SecretRecords(cs2), one)
	if err != nil || in.Base != nil || in.Abandoned == nil {
		t.Errorf("pending-install: base %v abandoned %v err %v", in.Base, in.Abandoned, err)
	}

	// The abandoned revision is gone.
	gone := abandoned
	gone.RecordName, gone.Revision = helmx.ReleaseSecretName("web", 9), 9
	if _, err := LoadConvergeInput(ctx, helmx.SecretRecords(cs), gone); err == nil || !strings.Contains(err.Error(), "revision 9 is gone") {
		t.Errorf("missing revision: %v", err)
	}
}

func TestConvergeAbandonedUninstall(t *testing.T) {
	// An interrupted uninstall is never converged: nothing is read or written.
	rep, err := ConvergeAbandoned(context.Background(), nil, helmx.Records{},
		helmx.Summary{Name: "web", Namespace: "shop", Revision: 3, Status: common.StatusUninstalling}, ConvergeOptions{})
	if err != nil || rep.Skipped == "" || rep.Changed() {
		t.Errorf("report %+v err %v", rep, err)
	}
}
