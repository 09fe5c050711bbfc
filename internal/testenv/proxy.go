package testenv

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"k8s.io/client-go/rest"
)

// Proxy starts, for the test, an HTTP server in front of the local API
// server: handle serves every request, answering it itself or passing it on
// with forward (which reaches the API server with the admin credentials).
// It returns the configuration of a client that goes through it.
func (e *Env) Proxy(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, forward http.Handler)) *rest.Config {
	t.Helper()
	srv, err := NewProxy(e.Config, handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, QPS: 100, Burst: 200}
}

// NewProxy starts an HTTP server in front of the API server cfg reaches:
// handle serves every request, answering it itself or passing it on with
// forward (which reaches the API server with cfg's credentials, streaming
// watches as they come). Close it when done.
func NewProxy(cfg *rest.Config, handle func(w http.ResponseWriter, r *http.Request, forward http.Handler)) (*httptest.Server, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	if rp.Transport, err = rest.TransportFor(cfg); err != nil {
		return nil, err
	}
	rp.FlushInterval = -1 // watches stream
	rp.ErrorLog = log.New(io.Discard, "", 0)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, rp) })), nil
}
