package recovery

import (
	"encoding/json"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/jsonmergepatch"
	"k8s.io/apimachinery/pkg/util/mergepatch"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes/scheme"
)

// threeWayPatch is the client-side revert: the patch that takes live from
// original to modified, keeping other writers' changes to fields neither
// mentions; nil when applying it would change nothing. Kinds compiled into client-go get a strategic merge patch, any
// other kind (custom resources) a JSON merge patch, as helm's client-side
// update does.
func threeWayPatch(original, modified, live *unstructured.Unstructured) ([]byte, types.PatchType, error) {
	o, err := json.Marshal(original.Object)
	if err != nil {
		return nil, "", err
	}
	m, err := json.Marshal(modified.Object)
	if err != nil {
		return nil, "", err
	}
	cur, err := json.Marshal(live.Object)
	if err != nil {
		return nil, "", err
	}
	pre := []mergepatch.PreconditionFunc{
		mergepatch.RequireKeyUnchanged("apiVersion"),
		mergepatch.RequireKeyUnchanged("kind"),
		mergepatch.RequireMetadataKeyUnchanged("name"),
	}
	typed, err := scheme.Scheme.New(modified.GroupVersionKind())
	if err != nil {
		// A no-op merge patch is caught after the write: the
		// resourceVersion does not move.
		p, err := jsonmergepatch.CreateThreeWayJSONMergePatch(o, m, cur, pre...)
		if err != nil || isEmptyPatch(p) {
			return nil, types.MergePatchType, err
		}
		return p, types.MergePatchType, nil
	}
	pm, err := strategicpatch.NewPatchMetaFromStruct(typed)
	if err != nil {
		return nil, "", err
	}
	p, err := strategicpatch.CreateThreeWayMergePatch(o, m, cur, pm, true, pre...)
	if err != nil || isEmptyPatch(p) {
		return nil, types.StrategicMergePatchType, err
	}
	// A patch that only deletes fields the live object lacks changes
	// nothing: write nothing, and report the object in sync.
	after, err := strategicpatch.StrategicMergePatch(cur, p, typed)
	if err != nil {
		return nil, "", err
	}
	if sameJSON(cur, after) {
		return nil, types.StrategicMergePatchType, nil
	}
	return p, types.StrategicMergePatchType, nil
}

// isEmptyPatch reports a patch that changes nothing.
func isEmptyPatch(p []byte) bool {
	s := strings.TrimSpace(string(p))
	return s == "" || s == "{}" || s == "null"
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// withResourceVersion adds metadata.resourceVersion to a merge patch, which
// makes the API server apply it only to that version.
func withResourceVersion(patch []byte, rv string) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	md, _ := m["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	md["resourceVersion"] = rv
	m["metadata"] = md
	return json.Marshal(m)
}

// applyBody is the server-side apply configuration: the object, with the
// resourceVersion read as a precondition (it is not a managed field).
func applyBody(o *unstructured.Unstructured, rv string) ([]byte, error) {
	c := o.DeepCopy()
	c.SetResourceVersion(rv)
	return json.Marshal(c.Object)
}
