package main

import (
	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
)

// reqKey is one kind of request the controller made (countproxy's key;
// Client is always empty here, Phase empty once counted by phase).
type reqKey = countproxy.Key

// request is one request the controller made, for the reads of full
// Secrets.
type request = countproxy.Request

// phaseCounts counts the controller's requests of one phase, keyed
// without it.
func phaseCounts(px *countproxy.Proxy, phase string) map[reqKey]int {
	return px.Count(func(r countproxy.Request) bool { return r.Phase == phase },
		func(k reqKey) reqKey { k.Phase = ""; return k })
}

// fullSecretRead tells the reads of whole Secrets (get or list without
// asking for metadata only).
func fullSecretRead(r countproxy.Request) bool {
	return r.Resource == "secrets" && !r.Meta && (r.Verb == "get" || r.Verb == "list")
}
