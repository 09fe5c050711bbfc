package chaos

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// protobufRecord is a release record as helm's typed client may send it.
func protobufRecord(t *testing.T, status string) []byte {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	enc := scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	b, err := runtime.Encode(enc, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.r.v3", Labels: map[string]string{"owner": "helm", "name": "r", "status": status, "version": "3"}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClassify(t *testing.T) {
	const ns = "/api/v1/namespaces/n"
	rec := func(status string) []byte {
		return []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"sh.helm.release.v1.r.v2","labels":{"name":"r","owner":"helm","status":"` + status + `","version":"2"}}}`)
	}
	for _, c := range []struct {
		name, method, path string
		watch              bool
		body               []byte
		want               string
	}{
		{"pending create", "POST", ns + "/secrets", false, rec("pending-upgrade"), "after-pending-write"},
		{"pending create, protobuf", "POST", ns + "/secrets", false, protobufRecord(t, "pending-upgrade"), "after-pending-write"},
		{"deployed, protobuf", "PUT", ns + "/secrets/sh.helm.release.v1.r.v3", false, protobufRecord(t, "deployed"), "after-final-write"},
		{"pending install", "POST", ns + "/secrets", false, rec("pending-install"), "after-pending-write"},
		{"pending rollback", "POST", ns + "/configmaps", false, rec("pending-rollback"), "after-pending-write"},
		{"uninstalling", "PUT", ns + "/secrets/sh.helm.release.v1.r.v2", false, rec("uninstalling"), "after-pending-write"},
		{"deployed", "PUT", ns + "/secrets/sh.helm.release.v1.r.v2", false, rec("deployed"), "after-final-write"},
		{"uninstalled", "PUT", ns + "/secrets/sh.helm.release.v1.r.v2", false, rec("uninstalled"), "after-final-write"},
		{"superseded is no point", "PUT", ns + "/secrets/sh.helm.release.v1.r.v1", false, rec("superseded"), ""},
		{"record delete", "DELETE", ns + "/secrets/sh.helm.release.v1.r.v1", false, nil, "after-final-write"},
		{"pre hook", "POST", ns + "/configmaps", false, []byte(`{"metadata":{"annotations":{"helm.sh/hook":"pre-install,pre-upgrade"}}}`), "pre-hook"},
		{"post hook", "PATCH", ns + "/configmaps/r-post-hook", false, []byte(`{"metadata":{"annotations":{"helm.sh/hook":"post-upgrade"}}}`), "post-hook"},
		{"hook deleted before creation", "DELETE", ns + "/configmaps/r-pre-hook", false, nil, ""},
		{"apply", "PATCH", "/apis/apps/v1/namespaces/n/deployments/r", false, []byte(`{"kind":"Deployment"}`), "apply"},
		{"uninstall's delete", "DELETE", "/apis/apps/v1/namespaces/n/deployments/r", false, nil, "apply"},
		{"a chart's Secret is applied", "POST", ns + "/secrets", false, []byte(`{"metadata":{"name":"s"}}`), "apply"},
		{"lease write", "PUT", "/apis/coordination.k8s.io/v1/namespaces/n/leases/x", false, []byte(`{}`), ""},
		{"the lock's beat", "PUT", ns + "/secrets/helm-autorecover.v1.r", false, []byte(`{"kind":"Secret"}`), ""},
		{"the lock's gate patch", "PATCH", ns + "/secrets/sh.helm.release.v1.r.v2", false, []byte(`{"metadata":{"annotations":{"x":"y"}}}`), ""},
		{"event", "POST", ns + "/events", false, []byte(`{}`), ""},
		{"watch of the chart", "GET", "/apis/apps/v1/namespaces/n/deployments", true, nil, "wait"},
		{"list is no wait", "GET", "/apis/apps/v1/namespaces/n/deployments", false, nil, ""},
		{"watch of records", "GET", ns + "/secrets", true, nil, ""},
	} {
		if got := classify(c.method, c.path, c.watch, c.body); got != c.want {
			t.Errorf("%s: classify(%s %s) = %q; want %q", c.name, c.method, c.path, got, c.want)
		}
	}
}
