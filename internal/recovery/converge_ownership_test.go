package recovery

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func liveObj(ann, labels map[string]string, created time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "web-extra"}}}
	u.SetAnnotations(ann)
	u.SetLabels(labels)
	u.SetCreationTimestamp(metav1.NewTime(created))
	return u
}

func ofKind(u *unstructured.Unstructured, apiVersion, kind string) *unstructured.Unstructured {
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
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
		{"a PersistentVolumeClaim the revision created", ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "v1", "PersistentVolumeClaim"), rendered, revAt, "PersistentVolumeClaim holds data"},
		{"a Namespace the revision created", ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "v1", "Namespace"), rendered, revAt, "Namespace holds everything in it"},
		{"a CRD the revision created", ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "apiextensions.k8s.io/v1", "CustomResourceDefinition"), rendered, revAt, "CustomResourceDefinition holds every custom resource"},
		{"a PersistentVolume", ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "v1", "PersistentVolume"), rendered, revAt, "PersistentVolume holds data"},
		{"a StatefulSet whose claims go when it is deleted", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "apps/v1", "StatefulSet"), "Delete", "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"), rendered, revAt, "persistentVolumeClaimRetentionPolicy.whenDeleted is Delete"},
		{"a StatefulSet whose claims go when it is scaled down", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "apps/v1", "StatefulSet"), "Delete", "spec", "persistentVolumeClaimRetentionPolicy", "whenScaled"), rendered, revAt, "whenScaled is Delete"},
		{
			"a StatefulSet that renders Delete, live Retain", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "apps/v1", "StatefulSet"), "Retain", "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"),
			withField(ofKind(rendered.DeepCopy(), "apps/v1", "StatefulSet"), "Delete", "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"), revAt, "whenDeleted is Delete",
		},
		{"a StatefulSet that retains its claims", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "apps/v1", "StatefulSet"), "Retain", "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"), rendered, revAt, ""},
		{"a LoadBalancer Service", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "v1", "Service"), "LoadBalancer", "spec", "type"), rendered, revAt, "external address"},
		{"a ClusterIP Service", withField(ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "v1", "Service"), "ClusterIP", "spec", "type"), rendered, revAt, ""},
		{"a kind named like one, another group", ofKind(liveObj(owned, helmLabel, revAt.Add(time.Second)), "example.com/v1", "Namespace"), rendered, revAt, ""},
	}
	for _, c := range cases {
		got := keepReason(c.live, c.rendered, "web", "shop", c.created, false)
		switch {
		case c.want == "" && got != "":
			t.Errorf("%s: kept (%s), want deleted", c.name, got)
		case c.want != "" && !strings.Contains(got, c.want):
			t.Errorf("%s: reason %q, want it to contain %q", c.name, got, c.want)
		}
	}

	// --recover-delete-data lifts the data-holder protection, and nothing
	// else: keep, ownership and creation time still decide.
	pvc := func(ann map[string]string, created time.Time) *unstructured.Unstructured {
		return ofKind(liveObj(ann, helmLabel, created), "v1", "PersistentVolumeClaim")
	}
	for _, c := range []struct {
		name string
		live *unstructured.Unstructured
		want string
	}{
		{"a PersistentVolumeClaim the revision created", pvc(owned, revAt.Add(time.Second)), ""},
		{"kept", pvc(with(owned, AnnotationResourcePolicy, "keep"), revAt.Add(time.Second)), "keep"},
		{"existed before", pvc(owned, revAt.Add(-time.Second)), "existed before"},
		{"another release's", pvc(with(owned, AnnotationReleaseName, "shop"), revAt.Add(time.Second)), "not owned"},
	} {
		got := keepReason(c.live, rendered, "web", "shop", revAt, true)
		if (c.want == "" && got != "") || (c.want != "" && !strings.Contains(got, c.want)) {
			t.Errorf("with deleteData, %s: reason %q, want %q", c.name, got, c.want)
		}
	}
}

// withField sets a string field of o.
func withField(o *unstructured.Unstructured, value string, path ...string) *unstructured.Unstructured {
	if err := unstructured.SetNestedField(o.Object, value, path...); err != nil {
		panic(err)
	}
	return o
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

// TestRevertLoses: a revert is a write too, and some writes delete: fewer
// replicas of a StatefulSet whose claims go when it scales down, a
// LoadBalancer Service turned into another type (issue 31 item 1, found
// by the adversarial review).
func TestRevertLoses(t *testing.T) {
	sts := func(replicas any, whenScaled string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": map[string]any{"name": "db"}, "spec": map[string]any{}}}
		if replicas != nil {
			_ = unstructured.SetNestedField(o.Object, replicas, "spec", "replicas")
		}
		if whenScaled != "" {
			_ = unstructured.SetNestedField(o.Object, whenScaled, "spec", "persistentVolumeClaimRetentionPolicy", "whenScaled")
		}
		return o
	}
	svc := func(typ string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": "web"}}}
		if typ != "" {
			_ = unstructured.SetNestedField(o.Object, typ, "spec", "type")
		}
		return o
	}
	for _, c := range []struct {
		name         string
		live, target *unstructured.Unstructured
		want         string
	}{
		{"scaled down, claims deleted", sts(int64(2), "Delete"), sts(float64(1), ""), "from 2 to 1 replicas"},
		{"scaled down to the default", sts(int64(3), "Delete"), sts(nil, ""), "from 3 to 1 replicas"},
		{"scaled down, claims retained", sts(int64(2), "Retain"), sts(float64(1), ""), ""},
		{"scaled up", sts(int64(1), "Delete"), sts(float64(2), ""), ""},
		{"LoadBalancer to ClusterIP", svc("LoadBalancer"), svc(""), "into ClusterIP"},
		{"LoadBalancer to NodePort", svc("LoadBalancer"), svc("NodePort"), "into NodePort"},
		{"LoadBalancer stays", svc("LoadBalancer"), svc("LoadBalancer"), ""},
		{"ClusterIP to LoadBalancer", svc("ClusterIP"), svc("LoadBalancer"), ""},
	} {
		got := revertLoses(c.live, c.target)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q; want %q", c.name, got, c.want)
		}
	}
}
