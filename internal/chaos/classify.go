package chaos

import (
	"net/http"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

var (
	recordPath = regexp.MustCompile(`/api/v1/namespaces/[^/]+/(?:secrets|configmaps)(?:/sh\.helm\.release\.v1\.[^/]+)?$`)
	hookAnn    = regexp.MustCompile(`"helm\.sh/hook":"(pre|post)-`)
)

// classify names the point a request of helm's reaches once it is
// answered, from its method, path, whether it is a watch, and its body
// ("" for none). It is the chaos build's map from helm's requests to the
// steps of an operation:
//
//   - a write of a release record (helm's driver: a Secret or ConfigMap
//     labelled owner=helm) with a pending status, or uninstalling, is
//     after-pending-write; with deployed or uninstalled, or its delete, is
//     after-final-write;
//   - a write whose body carries a helm.sh/hook annotation pre-* or post-*
//     is pre-hook or post-hook;
//   - any other write of an object (not a Lease, not the lock's beat
//     helm-autorecover.v1.*, not an Event) is apply;
//     helm deleting a hook of the suite's chart (named *-hook) before it
//     creates it again is not;
//   - a watch of anything but Secrets, Leases and Events is wait.
//
// recordLabels are the labels of a Secret or ConfigMap in body, JSON or
// protobuf (helm's typed clients may send either); nil for anything else.
func recordLabels(path string, body []byte) map[string]string {
	if len(body) == 0 || !recordPath.MatchString(path) {
		return nil
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if err != nil {
		return nil
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		return o.Labels
	case *corev1.ConfigMap:
		return o.Labels
	}
	return nil
}

func classify(method, path string, watch bool, body []byte) string {
	if method == http.MethodGet {
		if watch && !strings.Contains(path, "/secrets") && !strings.Contains(path, "/leases") && !strings.Contains(path, "/events") {
			return "wait"
		}
		return ""
	}
	labels := recordLabels(path, body)
	isRecord := recordPath.MatchString(path) && (labels["owner"] == "helm" || strings.Contains(path, "sh.helm.release.v1."))
	switch {
	case isRecord && method == http.MethodDelete:
		return "after-final-write"
	case isRecord:
		switch labels["status"] {
		case "pending-install", "pending-upgrade", "pending-rollback", "uninstalling":
			return "after-pending-write"
		case "deployed", "uninstalled":
			return "after-final-write"
		}
		return ""
	case strings.Contains(path, "/leases") || strings.Contains(path, "/events") || strings.Contains(path, "/helm-autorecover.v1."):
		// The lock's own objects (a Lease, the beat) and Events.
		return ""
	case method == http.MethodDelete && strings.HasSuffix(path, "-hook"):
		return ""
	}
	if m := hookAnn.FindSubmatch(body); m != nil {
		return string(m[1]) + "-hook"
	}
	return "apply"
}
