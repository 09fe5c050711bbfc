package e2e

import (
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// stallProxy forwards TCP connections to the API server until Stall is
// called; from then on it holds every byte in both directions (connections
// stay open, nothing arrives): an API server that stopped answering, for
// one client only.
type stallProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	closed  bool
	conns   []net.Conn
}

// startStallProxy starts a proxy in front of env's API server and returns it
// with a kubeconfig that goes through it.
func startStallProxy(t *testing.T, env *testenv.Env) (*stallProxy, string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatalf("loading %s: %v", env.Kubeconfig, err)
	}
	var target string
	for _, c := range cfg.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			t.Fatalf("server %q: %v", c.Server, err)
		}
		target = u.Host
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	for _, c := range cfg.Clusters {
		// The serving certificate is valid for 127.0.0.1 on any port.
		c.Server = "https://" + ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-proxied")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
	go p.serve()
	t.Cleanup(p.close)
	return p, path
}

func (p *stallProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is stalled.
func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			_ = src.Close()
			return
		}
	}
}

// Stall stops forwarding.
func (p *stallProxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
