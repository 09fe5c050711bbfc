package main

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// faultProxy is an HTTP server in front of the API server for the fault
// groups: handle serves each request, answering it itself or passing it on
// with forward (which reaches the API server with the admin's credentials;
// the client's impersonation headers go along).
type faultProxy struct {
	srv *httptest.Server
}

// startFaultProxy starts a proxy; close it with Close.
func (s *suite) startFaultProxy(handle func(w http.ResponseWriter, r *http.Request, forward http.Handler)) (*faultProxy, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.o.kubeconfig)
	if err != nil {
		return nil, err
	}
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
	return &faultProxy{srv: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, rp) }))}, nil
}

func (p *faultProxy) Close() { p.srv.CloseClientConnections(); p.srv.Close() }

// kubeconfig writes a kubeconfig that reaches the API server through the
// proxy as the impersonated user (see userKubeconfig).
func (p *faultProxy) kubeconfig(s *suite, user string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: p.srv.URL}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{Impersonate: user, ImpersonateGroups: []string{"system:masters"}}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy", Namespace: "default"}
	cfg.CurrentContext = "proxy"
	path := filepath.Join(s.dir, "kubeconfig-proxy-"+user)
	return path, clientcmd.WriteToFile(*cfg, path)
}
