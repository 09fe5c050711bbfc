package recovery

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

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
