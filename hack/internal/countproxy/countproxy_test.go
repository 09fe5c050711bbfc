package countproxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		method, target                   string
		verb, resource, ns, name, client string
	}{
		{"GET", "/api/v1/namespaces/a/secrets/sh.helm.release.v1.web.v3", "get", "secrets", "a", "sh.helm.release.v1.web.v3", ""},
		{"GET", "/api/v1/namespaces/a/secrets?labelSelector=owner%3Dhelm", "list", "secrets", "a", "", ""},
		{"GET", "/api/v1/namespaces/a/secrets?watch=true", "watch", "secrets", "a", "", ""},
		{"POST", "/api/v1/namespaces/a/secrets", "create", "secrets", "a", "", ""},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/helm-autorecover.v1.web", "update", "leases.coordination.k8s.io", "a", "helm-autorecover.v1.web", ""},
		{"PATCH", "/apis/apps/v1/namespaces/a/deployments/web", "patch", "deployments.apps", "a", "web", ""},
		{"POST", "/api/v1/namespaces/a/pods/web-1/binding", "create", "pods/binding", "a", "web-1", ""},
		{"DELETE", "/api/v1/namespaces/a/configmaps", "deletecollection", "configmaps", "a", "", ""},
		{"GET", "/api/v1/nodes/n1", "get", "nodes", "", "n1", ""},
		{"GET", "/version", "get", "/version", "", "", ""},
		{"GET", "/c/ours/api/v1/namespaces/a/secrets/x", "get", "secrets", "a", "x", "ours"},
		{"GET", "/c/stock/openapi/v3", "get", "/openapi/v3", "", "", "stock"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.target, http.NoBody)
		client := untag(r)
		verb, resource, ns, name := Classify(r)
		if verb != c.verb || resource != c.resource || ns != c.ns || name != c.name || client != c.client {
			t.Errorf("%s %s = client %q, %s %s %s/%s; want client %q, %s %s %s/%s", c.method, c.target,
				client, verb, resource, ns, name, c.client, c.verb, c.resource, c.ns, c.name)
		}
	}
}
