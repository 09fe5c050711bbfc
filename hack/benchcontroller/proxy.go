package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// reqKey is one kind of request the controller made.
type reqKey struct {
	Phase    string
	Verb     string // get, list, watch, create, update, patch, delete, ...
	Resource string // secrets, leases.coordination.k8s.io, ...; "/path" for non-resource URLs
	Meta     bool   // asked for metadata only (PartialObjectMetadata)
}

// request is one request the controller made, for the reads of full
// Secrets.
type request struct {
	Phase, Verb, Namespace, Name, Selector string
}

// proxy stands between the controller and the API server and counts every
// request the controller makes, by phase, verb and resource: the API
// server's own metrics cannot tell clients apart, and its audit log (see
// hack/local-cluster.sh) records only writes to Secrets, ConfigMaps and
// Leases. It forwards with the admin's credentials, streaming watches.
type proxy struct {
	url string
	srv *http.Server

	mu     sync.Mutex
	phase  string
	counts map[reqKey]int
	// fullSecrets lists the reads of whole Secrets (get or list without
	// asking for metadata only).
	fullSecrets []request
	agents      map[string]int
}

func startProxy(cfg *rest.Config) (*proxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	if rp.Transport, err = rest.TransportFor(cfg); err != nil {
		return nil, err
	}
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{url: "http://" + l.Addr().String(), phase: "startup", counts: map[reqKey]int{}, agents: map[string]int{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.count(r)
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

func (p *proxy) close() { _ = p.srv.Close() }

func (p *proxy) setPhase(phase string) {
	p.mu.Lock()
	p.phase = phase
	p.mu.Unlock()
}

func (p *proxy) count(r *http.Request) {
	verb, resource, ns, name := classify(r)
	meta := strings.Contains(r.Header.Get("Accept"), "PartialObjectMetadata")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[reqKey{Phase: p.phase, Verb: verb, Resource: resource, Meta: meta}]++
	p.agents[r.Header.Get("User-Agent")]++
	if resource == "secrets" && !meta && (verb == "get" || verb == "list") {
		p.fullSecrets = append(p.fullSecrets, request{Phase: p.phase, Verb: verb, Namespace: ns, Name: name, Selector: r.URL.Query().Get("labelSelector")})
	}
}

// snapshot returns the counts of one phase ("" for all), keyed without it.
func (p *proxy) snapshot(phase string) map[reqKey]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[reqKey]int{}
	for k, n := range p.counts {
		if phase == "" || k.Phase == phase {
			k.Phase = ""
			out[k] += n
		}
	}
	return out
}

func (p *proxy) userAgents() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.agents))
	for a := range p.agents {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

func (p *proxy) fullSecretReads() []request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]request(nil), p.fullSecrets...)
}

// classify names a request to the API server as its audit log does: verb,
// resource (resource.group, with /subresource), namespace and name.
func classify(r *http.Request) (verb, resource, ns, name string) {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var rest []string
	group := ""
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		rest = segs[2:]
	case len(segs) >= 4 && segs[0] == "apis":
		group, rest = segs[1], segs[3:]
	default:
		return strings.ToLower(r.Method), "/" + strings.Join(segs, "/"), "", ""
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		ns, rest = rest[1], rest[2:]
	}
	resource = rest[0]
	if len(rest) > 1 {
		name = rest[1]
	}
	if group != "" {
		resource += "." + group
	}
	if len(rest) > 2 {
		resource += "/" + strings.Join(rest[2:], "/")
	}
	w := r.URL.Query().Get("watch")
	switch r.Method {
	case http.MethodGet:
		switch {
		case w == "true" || w == "1":
			verb = "watch"
		case name == "":
			verb = "list"
		default:
			verb = "get"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if name == "" {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(r.Method)
	}
	return verb, resource, ns, name
}

// writeKubeconfig writes a kubeconfig for a client of the proxy.
func writeKubeconfig(dir, server string) (string, error) {
	path := filepath.Join(dir, "controller.kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster:
    server: %s
users:
- name: bench
  user: {}
contexts:
- name: bench
  context:
    cluster: bench
    user: bench
    namespace: default
current-context: bench
`, server)
	return path, os.WriteFile(path, []byte(body), 0o600)
}
