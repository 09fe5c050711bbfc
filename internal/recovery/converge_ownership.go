package recovery

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Helm's ownership metadata and resource policy.
const (
	AnnotationReleaseName      = "meta.helm.sh/release-name"
	AnnotationReleaseNamespace = "meta.helm.sh/release-namespace"
	LabelManagedBy             = "app.kubernetes.io/managed-by"
	ManagedByHelm              = "Helm"
	AnnotationResourcePolicy   = "helm.sh/resource-policy"
	ResourcePolicyKeep         = "keep"

	// ReasonPolicyKeep is why converge keeps an object whose live
	// annotation is exactly helm.sh/resource-policy: keep, the one spelling
	// helm's own upgrade and rollback honour (they delete an object their
	// target revision no longer renders unless its live annotation is that).
	ReasonPolicyKeep = AnnotationResourcePolicy + ": " + ResourcePolicyKeep

	// HelmFieldManager is the field manager stock helm 3 and 4, and this
	// tool, write objects under.
	HelmFieldManager = "helm"
)

// withOwnership is the object as helm wrote it: rendered, plus the
// ownership label and annotations helm adds to every object of a release.
func withOwnership(o *unstructured.Unstructured, release, ns string) *unstructured.Unstructured {
	c := o.DeepCopy()
	labels := c.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedByHelm
	c.SetLabels(labels)
	ann := c.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationReleaseName] = release
	ann[AnnotationReleaseNamespace] = ns
	c.SetAnnotations(ann)
	return c
}

// notOwned says why live does not belong to the release, or "" when it does
// (helm's own test: managed-by label and both annotations).
func notOwned(live *unstructured.Unstructured, release, ns string) string {
	ann := live.GetAnnotations()
	switch {
	case ann[AnnotationReleaseName] != release:
		return fmt.Sprintf("not owned by this release: annotation %s is %q", AnnotationReleaseName, ann[AnnotationReleaseName])
	case ann[AnnotationReleaseNamespace] != ns:
		return fmt.Sprintf("not owned by this release: annotation %s is %q", AnnotationReleaseNamespace, ann[AnnotationReleaseNamespace])
	case live.GetLabels()[LabelManagedBy] != ManagedByHelm:
		return fmt.Sprintf("not owned by this release: label %s is %q", LabelManagedBy, live.GetLabels()[LabelManagedBy])
	}
	return ""
}

func hasKeepPolicy(o *unstructured.Unstructured) bool {
	return strings.EqualFold(strings.TrimSpace(o.GetAnnotations()[AnnotationResourcePolicy]), ResourcePolicyKeep)
}

// keepReason says why an object only the abandoned revision renders must
// not be deleted, or "" when it may be. deleteData (--recover-delete-data)
// lifts the protection of the kinds dataHolder names, and only that.
func keepReason(live, rendered *unstructured.Unstructured, release, ns string, abandonedCreated time.Time, deleteData bool) string {
	if why := notOwned(live, release, ns); why != "" {
		return why
	}
	if live.GetAnnotations()[AnnotationResourcePolicy] == ResourcePolicyKeep {
		return ReasonPolicyKeep
	}
	if hasKeepPolicy(live) || hasKeepPolicy(rendered) {
		// Kept, but helm's own rollback and upgrade would delete it: the
		// reason must not read as ReasonPolicyKeep (ConvergeReport.HeldBack).
		return fmt.Sprintf("%s asks to keep it (the live value is %q; helm itself honours only an exact %q on the live object)",
			AnnotationResourcePolicy, live.GetAnnotations()[AnnotationResourcePolicy], ResourcePolicyKeep)
	}
	if why := dataHolder(live, rendered); why != "" && !deleteData {
		return why + deleteDataHint
	}
	if abandonedCreated.IsZero() {
		return "the abandoned revision's creation time is unknown"
	}
	// Both timestamps are the API server's, in whole seconds.
	created := live.GetCreationTimestamp().Time
	if created.Before(abandonedCreated) {
		return fmt.Sprintf("it existed before the abandoned revision (created %s, revision written %s)",
			created.UTC().Format(time.RFC3339), abandonedCreated.UTC().Format(time.RFC3339))
	}
	// In the same second, the order is unknown (helm writes the revision
	// before it applies anything, but a user may have created the object a
	// moment before and let the revision adopt it). An object helm created
	// has been written by helm's field manager only (controllers' status
	// writes aside); one written by another manager too may have existed
	// before, and deleting it could lose data.
	if created.Equal(abandonedCreated) {
		for _, mf := range live.GetManagedFields() {
			if mf.Manager != HelmFieldManager && mf.Subresource == "" {
				return fmt.Sprintf("it was created in the same second as the abandoned revision (%s) and also written by field manager %q, so it may have existed before",
					created.UTC().Format(time.RFC3339), mf.Manager)
			}
		}
	}
	return ""
}

// deleteDataHint ends the reason an object is kept for its data: the one
// flag that lifts the rule.
const deleteDataHint = "; recovery deletes it only with --recover-delete-data"

// dataHolder says why deleting o destroys more than the object itself, or
// "" when it does not, judged on the object alone (what it owns through
// ownerReferences is cascadeGuard's): a PersistentVolumeClaim or
// PersistentVolume loses its volume's data, a CustomResourceDefinition every
// custom resource of its kind, a Namespace everything in it, a StatefulSet
// whose persistentVolumeClaimRetentionPolicy deletes its claims takes them
// (even those not created yet), and a Service of type LoadBalancer loses its
// external address for good. The live object and the rendered one are both
// asked: either saying so is enough.
func dataHolder(live, rendered *unstructured.Unstructured) string {
	for _, o := range []*unstructured.Unstructured{live, rendered} {
		if o == nil {
			continue
		}
		gk := o.GroupVersionKind().GroupKind()
		switch {
		case gk.Group == "" && gk.Kind == "PersistentVolumeClaim":
			return "a PersistentVolumeClaim holds data that a delete destroys with it"
		case gk.Group == "" && gk.Kind == "PersistentVolume":
			return "a PersistentVolume holds data that a delete may destroy with it"
		case gk.Group == "" && gk.Kind == "Namespace":
			return "a Namespace holds everything in it, which a delete destroys with it"
		case gk.Group == "apiextensions.k8s.io" && gk.Kind == "CustomResourceDefinition":
			return "a CustomResourceDefinition holds every custom resource of its kind, which a delete destroys with it"
		case gk.Group == "apps" && gk.Kind == "StatefulSet":
			if p := claimRetention(o); p != "" {
				return "a StatefulSet whose persistentVolumeClaimRetentionPolicy." + p + " is Delete takes its PersistentVolumeClaims, and their data, with it"
			}
		case gk.Group == "" && gk.Kind == "Service":
			if t, _, _ := unstructured.NestedString(o.Object, "spec", "type"); t == "LoadBalancer" {
				return "a Service of type LoadBalancer loses its external address for good when deleted"
			}
		}
	}
	return ""
}

// claimRetention names the field of a StatefulSet's
// persistentVolumeClaimRetentionPolicy that deletes its claims (whenDeleted,
// or whenScaled, whose claims the garbage collector takes with their pods),
// "" when neither does.
func claimRetention(sts *unstructured.Unstructured) string {
	for _, f := range []string{"whenDeleted", "whenScaled"} {
		if v, _, _ := unstructured.NestedString(sts.Object, "spec", "persistentVolumeClaimRetentionPolicy", f); v == "Delete" {
			return f
		}
	}
	return ""
}

// revertLoses says why setting live back to the rendering target destroys
// data, or "" when it does not: a revert is a write too, and some writes
// delete. A StatefulSet whose persistentVolumeClaimRetentionPolicy.whenScaled
// is Delete loses the claims of every replica a lower replica count
// removes; a Service of type LoadBalancer moved to another type loses its
// external address.
func revertLoses(live, target *unstructured.Unstructured) string {
	gk := live.GroupVersionKind().GroupKind()
	switch {
	case gk.Group == "apps" && gk.Kind == "StatefulSet":
		if v, _, _ := unstructured.NestedString(live.Object, "spec", "persistentVolumeClaimRetentionPolicy", "whenScaled"); v != "Delete" {
			return ""
		}
		have, want := replicas(live), replicas(target)
		if want < have {
			return fmt.Sprintf("reverting it would scale it from %d to %d replicas, and its persistentVolumeClaimRetentionPolicy.whenScaled: Delete would delete the claims, and their data, of the replicas removed", have, want)
		}
	case gk.Group == "" && gk.Kind == "Service":
		have, _, _ := unstructured.NestedString(live.Object, "spec", "type")
		want, _, _ := unstructured.NestedString(target.Object, "spec", "type")
		if have == "LoadBalancer" && want != "LoadBalancer" {
			return "reverting it would turn a Service of type LoadBalancer into " + cmp.Or(want, "ClusterIP") + ", and its external address would be gone for good"
		}
	}
	return ""
}

// replicas is a workload's spec.replicas, 1 when unset (the API server's
// default).
func replicas(o *unstructured.Unstructured) int64 {
	if n, ok, _ := unstructured.NestedInt64(o.Object, "spec", "replicas"); ok {
		return n
	}
	if f, ok, _ := unstructured.NestedFloat64(o.Object, "spec", "replicas"); ok {
		return int64(f)
	}
	return 1
}
