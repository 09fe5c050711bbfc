package recovery

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

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
