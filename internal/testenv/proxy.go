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
	target, err := url.Parse(e.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	if rp.Transport, err = rest.TransportFor(e.Config); err != nil {
		t.Fatal(err)
	}
	rp.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, rp) }))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, QPS: 100, Burst: 200}
}
