package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// resolved is one manifest object with its REST mapping and namespace.
type resolved struct {
	obj     *unstructured.Unstructured
	mapping *meta.RESTMapping // nil when the kind is not served
	ref     ObjectRef
}

func (r resolved) key() objKey {
	return keyOf(r.obj.GroupVersionKind().GroupKind(), r.ref.Namespace, r.ref.Name)
}

func (c *converger) resolveAll(objs []*unstructured.Unstructured) ([]resolved, []error) {
	out := make([]resolved, 0, len(objs))
	var errs []error
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		r := resolved{obj: o, ref: ObjectRef{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName()}}
		m, err := c.kc.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		switch {
		case meta.IsNoMatchError(err):
			// Not served: no such object can exist. The namespace only
			// matters for matching, so assume helm's default.
			r.ref.Namespace = objNamespace(o, true, c.ns)
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: mapping %s: %w", r.ref, gvk, err))
			continue
		default:
			r.mapping = m
			r.ref.Namespace = objNamespace(o, m.Scope.Name() == meta.RESTScopeNameNamespace, c.ns)
		}
		out = append(out, r)
	}
	return out, errs
}

// objNamespace is the namespace helm writes an object to: its own, or the
// release's when it names none; none for cluster-scoped kinds.
func objNamespace(o *unstructured.Unstructured, namespaced bool, releaseNS string) string {
	if !namespaced {
		return ""
	}
	if ns := o.GetNamespace(); ns != "" {
		return ns
	}
	return releaseNS
}

// objKey identifies an object across revisions as helm matches them: group,
// kind, namespace and name (not the version).
type objKey struct {
	Group, Kind, Namespace, Name string
}

func keyOf(gk schema.GroupKind, ns, name string) objKey {
	return objKey{Group: gk.Group, Kind: gk.Kind, Namespace: ns, Name: name}
}

type pair struct{ Abandoned, Base resolved }

type convergePlan struct {
	// Both: objects in both manifests, in the base manifest's order.
	Both []pair
	// OnlyAbandoned: objects only the abandoned revision renders, in reverse
	// manifest order (helm installs in kind order; deleting in reverse puts
	// dependants before what they depend on).
	OnlyAbandoned []resolved
}

func plan(abandoned, base []resolved) convergePlan {
	var p convergePlan
	inBase := map[objKey]bool{}
	abByKey := map[objKey]resolved{}
	for _, a := range abandoned {
		abByKey[a.key()] = a
	}
	for _, b := range base {
		k := b.key()
		inBase[k] = true
		if a, ok := abByKey[k]; ok {
			p.Both = append(p.Both, pair{Abandoned: a, Base: b})
		}
	}
	for _, a := range slices.Backward(abandoned) {
		if !inBase[a.key()] {
			p.OnlyAbandoned = append(p.OnlyAbandoned, a)
		}
	}
	return p
}

// parseManifest splits a release manifest into objects, dropping empty
// documents and flattening List kinds as helm's builder does.
func parseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d has no apiVersion or kind", i+1)
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			for j := range list.Items {
				out = append(out, &list.Items[j])
			}
			continue
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("document %d (%s) has no name", i+1, u.GetKind())
		}
		out = append(out, u)
	}
}

func sameObject(a, b *unstructured.Unstructured) bool {
	ja, err1 := json.Marshal(a.Object)
	jb, err2 := json.Marshal(b.Object)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
