package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InstallCRD installs a CustomResourceDefinition of kind in group (plural
// its resource), with the scope and owners given and any fields allowed,
// waits until the API server serves it, and removes it when the test ends.
func (e *Env) InstallCRD(t testing.TB, group, plural, kind string, scope apiextv1.ResourceScope, owners []metav1.OwnerReference) *apiextv1.CustomResourceDefinition {
	t.Helper()
	ctx := context.Background()
	ax, err := apiextclient.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group, OwnerReferences: owners},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List"},
			Scope: scope,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: new(true)}},
			}},
		},
	}
	out, err := ax.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{FieldManager: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ax.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := ax.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range c.Status.Conditions {
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					return out
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established within a minute (last read: %v)", crd.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WriteChart writes a chart's files (path relative to the chart: body) to
// a new folder and returns it.
func WriteChart(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Claim is a 1Gi ReadWriteOnce PersistentVolumeClaim named name, owned by
// owners (none: nil), as an operator or the tests create one.
func Claim(name string, owners ...metav1.OwnerReference) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: owners},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}
