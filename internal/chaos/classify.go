package chaos

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
)

var (
	recordPath = regexp.MustCompile(`/api/v1/namespaces/[^/]+/(?:secrets|configmaps)(?:/sh\.helm\.release\.v1\.[^/]+)?$`)
	statusLbl  = regexp.MustCompile(`"status":"([a-z-]+)"`)
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
//   - any other write of an object (not a Lease, not an Event) is apply;
//     helm deleting a hook of the suite's chart (named *-hook) before it
//     creates it again is not;
//   - a watch of anything but Secrets, Leases and Events is wait.
func classify(method, path string, watch bool, body []byte) string {
	if method == http.MethodGet {
		if watch && !strings.Contains(path, "/secrets") && !strings.Contains(path, "/leases") && !strings.Contains(path, "/events") {
			return "wait"
		}
		return ""
	}
	isRecord := recordPath.MatchString(path) && (bytes.Contains(body, []byte(`"owner":"helm"`)) || strings.Contains(path, "sh.helm.release.v1."))
	switch {
	case isRecord && method == http.MethodDelete:
		return "after-final-write"
	case isRecord:
		m := statusLbl.FindSubmatch(body)
		if m == nil {
			return ""
		}
		switch string(m[1]) {
		case "pending-install", "pending-upgrade", "pending-rollback", "uninstalling":
			return "after-pending-write"
		case "deployed", "uninstalled":
			return "after-final-write"
		}
		return ""
	case strings.Contains(path, "/leases") || strings.Contains(path, "/events"):
		return ""
	case method == http.MethodDelete && strings.HasSuffix(path, "-hook"):
		return ""
	}
	if m := hookAnn.FindSubmatch(body); m != nil {
		return string(m[1]) + "-hook"
	}
	return "apply"
}
