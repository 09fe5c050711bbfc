package recovery

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// A delete of one object can take others with it: the garbage collector
// deletes every object whose ownerReferences name only owners that are
// gone, and so on down the chain. Recovery deletes with background
// propagation, so an object that owns, directly or through a chain of
// owners, something dataHolder protects (a PersistentVolumeClaim, a
// StatefulSet whose retention policy deletes its claims, a LoadBalancer
// Service) must be kept like that object itself: a PostgreSQL operator's
// cluster resource owns its claims, a StatefulSet created with
// whenDeleted: Delete owns the claims its controller made.
//
// cascadeGuard finds those owners by walking up: it lists the protected
// objects of a scope (a namespace, or every namespace for a cluster-scoped
// object, which may own namespaced ones) and follows their ownerReferences
// to the top, reading each owner once. It is built only when recovery is
// about to delete something, so it costs nothing on the happy path.

// maxOwnerDepth bounds a chain of owners (ownerReferences may form cycles
// in a hostile cluster; the visited set stops those, this stops the rest).
const maxOwnerDepth = 16

// protectedScope is what one scope's walk found: the UID of every object
// whose deletion would reach a protected object, with what it would reach;
// err, when the walk could not finish (a list or an owner that could not
// be read): then nothing in the scope can be shown to be safe.
type protectedScope struct {
	owners map[types.UID]string
	err    error
}

type cascadeGuard struct {
	kc     *Kube
	scopes map[string]*protectedScope // by namespace; "" is every namespace
}

// protectedKinds are listed to find the roots of the walk: the kinds
// dataHolder keeps whose deletion by the garbage collector loses data.
// Namespaced ones are listed in the scope's namespace (every namespace for
// a cluster-scoped object's scope); cluster-scoped ones only for a
// cluster-scoped object, since the garbage collector lets no namespaced
// object own a cluster-scoped one.
var protectedKinds = []struct {
	gvr           schema.GroupVersionResource
	kind          string
	clusterScoped bool
}{
	{schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}, "PersistentVolumeClaim", false},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, "StatefulSet", false},
	{schema.GroupVersionResource{Version: "v1", Resource: "services"}, "Service", false},
	{schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, "Namespace", true},
	{schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}, "PersistentVolume", true},
	{schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}, "CustomResourceDefinition", true},
}

// reason says why deleting live would take a protected object with it
// through the garbage collector, or "" when it would not. live is
// namespaced when it has a namespace; a cluster-scoped object is checked
// against every namespace.
func (g *cascadeGuard) reason(ctx context.Context, live *unstructured.Unstructured) string {
	scope := g.scope(ctx, live.GetNamespace())
	if what, ok := scope.owners[live.GetUID()]; ok {
		return "deleting it would make the garbage collector delete " + what + " (ownerReferences)"
	}
	if scope.err != nil {
		return fmt.Sprintf("whether deleting it would make the garbage collector delete a PersistentVolumeClaim could not be checked: %v", scope.err)
	}
	return ""
}

func (g *cascadeGuard) scope(ctx context.Context, ns string) *protectedScope {
	if s, ok := g.scopes[ns]; ok {
		return s
	}
	if g.scopes == nil {
		g.scopes = map[string]*protectedScope{}
	}
	s := &protectedScope{owners: map[types.UID]string{}}
	g.scopes[ns] = s
	visited := map[types.UID]bool{}
	for _, pk := range protectedKinds {
		if pk.clusterScoped && ns != "" {
			continue
		}
		var list *unstructured.UnstructuredList
		var err error
		if pk.clusterScoped {
			list, err = g.kc.Dynamic.Resource(pk.gvr).List(ctx, metav1.ListOptions{})
		} else {
			list, err = g.kc.Dynamic.Resource(pk.gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			where := "namespace " + ns
			if ns == "" {
				where = "the cluster"
			}
			s.err = fmt.Errorf("listing %s in %s: %w", pk.gvr.Resource, where, err)
			return s
		}
		for i := range list.Items {
			root := &list.Items[i]
			root.SetAPIVersion(pk.gvr.GroupVersion().String())
			root.SetKind(pk.kind)
			if dataHolder(root, nil) == "" {
				continue // a StatefulSet that retains its claims, a Service without an external address
			}
			what := ObjectRef{Kind: pk.kind, Namespace: root.GetNamespace(), Name: root.GetName()}.String()
			if err := g.walk(ctx, root, what, visited, s, 0); err != nil {
				s.err = err
				return s
			}
		}
	}
	return s
}

// walk marks every owner of o, and theirs, as reaching what.
func (g *cascadeGuard) walk(ctx context.Context, o *unstructured.Unstructured, what string, visited map[types.UID]bool, s *protectedScope, depth int) error {
	if depth > maxOwnerDepth {
		return fmt.Errorf("the owners of %s go deeper than %d levels", what, maxOwnerDepth)
	}
	for _, ref := range o.GetOwnerReferences() {
		if _, seen := s.owners[ref.UID]; !seen {
			s.owners[ref.UID] = what
		}
		if visited[ref.UID] {
			continue
		}
		visited[ref.UID] = true
		owner, err := g.owner(ctx, o.GetNamespace(), ref)
		if err != nil {
			return fmt.Errorf("reading %s %s, an owner of %s: %w", ref.Kind, ref.Name, what, err)
		}
		if owner == nil {
			continue // gone, or another object by that name now: nothing above it owns this chain
		}
		if err := g.walk(ctx, owner, what, visited, s, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// owner reads the object ref names, in ns when its kind is namespaced; nil
// when it is gone or is another object by that name.
func (g *cascadeGuard) owner(ctx context.Context, ns string, ref metav1.OwnerReference) (*unstructured.Unstructured, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, err
	}
	gk := gv.WithKind(ref.Kind).GroupKind()
	m, err := g.kc.Mapper.RESTMapping(gk, gv.Version)
	if meta.IsNoMatchError(err) {
		// The version the reference was written with may no longer be
		// served; the object is the same in any served version.
		m, err = g.kc.Mapper.RESTMapping(gk)
	}
	switch {
	case meta.IsNoMatchError(err):
		// No version of the kind is served (its CRD is gone; the mapper
		// read discovery again before saying so): no such owner exists.
		return nil, nil
	case err != nil:
		return nil, err
	}
	var o *unstructured.Unstructured
	if m.Scope.Name() == meta.RESTScopeNameNamespace && ns != "" {
		o, err = g.kc.Dynamic.Resource(m.Resource).Namespace(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	} else {
		o, err = g.kc.Dynamic.Resource(m.Resource).Get(ctx, ref.Name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case o.GetUID() != ref.UID:
		return nil, nil
	}
	return o, nil
}
