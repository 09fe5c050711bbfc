// Package countproxy is the benchmarks' instrument for API requests: a
// reverse proxy in front of the API server that records every request its
// clients make (who, verb, resource, object, when, answer). The API server's
// own metrics cannot tell clients apart, and the local cluster's audit log
// (hack/local-cluster.sh) records only writes to Secrets, ConfigMaps and
// Leases. The proxy forwards with the credentials it is given (the admin's),
// streaming watches; its clients speak plain HTTP/1.1 to it and need no
// credentials.
//
// Clients are told apart by the server URL they are given: ClientURL(id)
// adds the path prefix /c/ID, which the proxy strips before forwarding
// (client-go keeps a server URL's path, as it does behind Rancher's proxy).
// Give one client the same URL on every run: helm-autorecover remembers its
// lock backend per API server URL.
package countproxy

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// clientPrefix starts the path of a tagged client's requests.
const clientPrefix = "/c/"

// Key is one kind of request: who made it, in which phase, with what verb
// on what resource.
type Key struct {
	Client   string // the id of ClientURL; "" for untagged clients
	Phase    string // set with SetPhase
	Verb     string // get, list, watch, create, update, patch, delete, ...
	Resource string // secrets, leases.coordination.k8s.io, pods/binding...; "/path" for non-resource URLs
	Meta     bool   // asked for metadata only (PartialObjectMetadata)
}

// Request is one request, as the proxy saw it.
type Request struct {
	Key
	Namespace, Name, Selector string
	// Query is the request's query string but for the label selector
	// (resourceVersion, resourceVersionMatch, fieldManager, ...).
	Query     string
	UserAgent string
	// Start is when the request reached the proxy, End when its answer
	// was passed on (a watch's end; zero while it is open).
	Start, End time.Time
	Code       int // 0 while open
}

// Write tells a request that changes something from a read.
func (r Request) Write() bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// Proxy counts the requests of its clients.
type Proxy struct {
	url string
	srv *http.Server

	mu    sync.Mutex
	phase string
	log   []Request
}

// Start starts a proxy to the API server of cfg on a free loopback port.
func Start(cfg *rest.Config) (*Proxy, error) {
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
	p := &Proxy{url: "http://" + l.Addr().String()}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rq := newRequest(r, untag(r))
		p.mu.Lock()
		rq.Phase = p.phase
		i := len(p.log)
		p.log = append(p.log, rq)
		p.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		rp.ServeHTTP(sw, r)
		p.mu.Lock()
		p.log[i].End, p.log[i].Code = time.Now(), sw.code
		p.mu.Unlock()
	}), ReadHeaderTimeout: time.Minute}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// URL is the proxy's address for untagged clients.
func (p *Proxy) URL() string { return p.url }

// ClientURL is the server URL for the client id (letters, digits, '-',
// '_' and '.').
func (p *Proxy) ClientURL(id string) string { return p.url + clientPrefix + id }

// Close stops the proxy.
func (p *Proxy) Close() { _ = p.srv.Close() }

// SetPhase labels the requests that reach the proxy from now on.
func (p *Proxy) SetPhase(phase string) {
	p.mu.Lock()
	p.phase = phase
	p.mu.Unlock()
}

// Requests returns the requests seen so far that keep accepts (all when
// keep is nil), in the order they reached the proxy; those still open
// (watches) are included, with no End.
func (p *Proxy) Requests(keep func(Request) bool) []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Request
	for _, rq := range p.log {
		if keep == nil || keep(rq) {
			out = append(out, rq)
		}
	}
	return out
}

// Count counts the requests keep accepts by their Key, mapped by key (to
// drop fields: a key with no Phase counts every phase together).
func (p *Proxy) Count(keep func(Request) bool, key func(Key) Key) map[Key]int {
	out := map[Key]int{}
	for _, rq := range p.Requests(keep) {
		k := rq.Key
		if key != nil {
			k = key(k)
		}
		out[k]++
	}
	return out
}

// UserAgents returns the user agents seen, sorted.
func (p *Proxy) UserAgents() []string {
	seen := map[string]bool{}
	for _, rq := range p.Requests(nil) {
		seen[rq.UserAgent] = true
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// untag strips a client's prefix from the request's path and returns its id.
func untag(r *http.Request) string {
	if !strings.HasPrefix(r.URL.Path, clientPrefix) {
		return ""
	}
	rest := strings.TrimPrefix(r.URL.Path, clientPrefix)
	id, path, _ := strings.Cut(rest, "/")
	r.URL.Path = "/" + path
	r.URL.RawPath = ""
	return id
}

func newRequest(r *http.Request, client string) Request {
	verb, resource, ns, name := Classify(r)
	return Request{
		Key: Key{
			Client: client, Verb: verb, Resource: resource,
			Meta: strings.Contains(r.Header.Get("Accept"), "PartialObjectMetadata"),
		},
		Namespace: ns, Name: name,
		Selector:  r.URL.Query().Get("labelSelector"),
		Query:     otherQuery(r),
		UserAgent: r.Header.Get("User-Agent"),
		Start:     time.Now(),
	}
}

// otherQuery is the request's query but for its label selector, sorted.
func otherQuery(r *http.Request) string {
	q := r.URL.Query()
	q.Del("labelSelector")
	return q.Encode()
}

// statusWriter remembers the status code of an answer; it flushes, so
// watches stream.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Classify names a request to the API server as its audit log does: verb,
// resource (resource.group, with /subresource), namespace and name.
func Classify(r *http.Request) (verb, resource, ns, name string) {
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

// WriteKubeconfig writes to path a kubeconfig whose one context reaches
// server (a proxy URL) with no credentials, in namespace ns ("" for
// default).
func WriteKubeconfig(path, server, ns string) error {
	if ns == "" {
		ns = "default"
	}
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
    namespace: %s
current-context: bench
`, server, ns)
	return os.WriteFile(path, []byte(body), 0o600)
}
