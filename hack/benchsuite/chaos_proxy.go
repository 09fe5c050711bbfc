package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
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
	srv, err := testenv.NewProxy(cfg, handle)
	if err != nil {
		return nil, err
	}
	return &faultProxy{srv: srv}, nil
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
