package protocol

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestEndReleasesAfterSlowDrain: a write of helm's answered 5xx (a failing
// admission webhook) may land until its deadline, so the fence's drain
// waits for it; End gives the lock back with a budget of its own that
// starts once the drain is over, so the lock is released, not left to
// expire (found by the review of issue 32's steps).
func TestEndReleasesAfterSlowDrain(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns)
	ctx := context.Background()
	c := settleConn(t, env.Config)
	l := settleAcquire(t, c, ns) // lease 15 s: renew deadline 14 s after the take
	helmCfg := settleProxy(t, env, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost || !strings.Contains(r.URL.Path, "/configmaps") {
			return false
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Internal error occurred: failed calling webhook","reason":"InternalError","code":500}`)
		return true
	}, nil)
	cs, err := kubernetes.NewForConfig(l.Fence().Wrap(helmCfg))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
	if err == nil {
		t.Fatal("helm's create succeeded; want it answered 500")
	}
	// Keep renews meanwhile (Run stops it just before End): one
	// renewal a few seconds later moves the lock's deadline past
	// the write's.
	time.Sleep(3 * time.Second)
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	var relErr error
	called := false
	l.End(ctx, Guarded{Released: func(err error) { relErr, called = err, true }}, errors.New("helm failed"))
	if !called {
		t.Fatal("Released not called")
	}
	if relErr != nil {
		t.Fatalf("the lock was not given back: %v", relErr)
	}
	st, err := c.Inspect(ctx, ns, "web", mustStores(t, c, ns))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != Free {
		t.Fatalf("lock after End: %v (holder %s), want free", st.State, st.HolderIdentity)
	}
}

func mustStores(t *testing.T, c *Conn, ns string) Stores {
	t.Helper()
	_, s, err := c.Stores(context.Background(), ns, BackendRelease)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
