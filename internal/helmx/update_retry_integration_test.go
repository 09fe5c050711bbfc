package helmx

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestIntegrationFenceSendsAFailedUpdateAgain: helm sends an update of a
// release record once and ignores the failure of some (marking the
// previous revision superseded: two revisions would then read deployed).
// The fence sends one that failed for a moment again, conditional on a
// fresh list, whether the failure came before the write landed (a 503, a
// reset connection) or after (the answer lost).
func TestIntegrationFenceSendsAFailedUpdateAgain(t *testing.T) {
	env := testenv.Get(t)
	reset := func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}
	for _, c := range []struct {
		name string
		fail func(w http.ResponseWriter, r *http.Request, forward http.Handler)
		// list: fail the fence's read before the update (the second list
		// of the records: the create lists them first), not the update;
		// the read is sent again (by the fence, or by client-go, which
		// sends helm's whole request again after a reset connection).
		list bool
	}{
		{name: "the fence's read before it reset", fail: reset, list: true},
		{name: "503 before it lands", fail: func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		}},
		{name: "connection reset before it lands", fail: reset},
		{name: "answer lost after it landed", fail: func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
			forward.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			var puts, lists, failed atomic.Int32
			cfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
				isList := r.Method == http.MethodGet && r.URL.Query().Has("labelSelector")
				if (!c.list && r.Method == http.MethodPut && puts.Add(1) == 1) || (c.list && isList && lists.Add(1) == 2) {
					failed.Add(1)
					c.fail(w, r, forward)
					return
				}
				if c.list && r.Method == http.MethodPut {
					puts.Add(1)
				}
				forward.ServeHTTP(w, r)
			})
			d := fencedDriver(t, cfg, ns, newHeld("retry-session", time.Now()))
			if err := store(t, d, 1, common.StatusDeployed); err != nil {
				t.Fatal(err)
			}
			if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); err != nil {
				t.Fatalf("update after one failed attempt: %v", err)
			}
			if want := map[bool]int32{false: 2, true: 1}[c.list]; failed.Load() != 1 || puts.Load() != want {
				t.Errorf("%d update(s) sent, %d request(s) failed; want one failure and %d update(s)", puts.Load(), failed.Load(), want)
			}
			got, err := d.Get(ReleaseSecretName("web", 1))
			if err != nil {
				t.Fatal(err)
			}
			if st := got.(*rspb.Release).Info.Status; st != common.StatusSuperseded {
				t.Errorf("revision 1 reads %s, want superseded", st)
			}
			if rec := lockOn(t, env, ns, 1); rec == nil || rec.Session != "retry-session" {
				t.Errorf("the lock on the newest record after the retry: %+v", rec)
			}
		})
	}
}

// TestIntegrationFenceDrainStopsRetries: once the fence is drained (the
// operation ends and its lock is about to be released), an update that
// keeps failing is not sent again, and Drain returns only when it has
// left the fence: nothing it sends lands after the lock's release.
func TestIntegrationFenceDrainStopsRetries(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	var puts atomic.Int32
	cfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if r.Method == http.MethodPut {
			puts.Add(1)
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		forward.ServeHTTP(w, r)
	})
	w := &WriteFence{}
	t.Cleanup(w.Guard(GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: newHeld("drain-session", time.Now())}))
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	if err := store(t, d, 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)) }()
	deadline := time.Now().Add(time.Minute)
	for puts.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the failed update was never sent again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Drain()
	after := puts.Load()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the update succeeded against a server that refuses every update")
		}
	case <-time.After(time.Minute):
		t.Fatal("the update did not end after the fence was drained")
	}
	if n := puts.Load(); n != after {
		t.Errorf("%d update(s) sent after Drain returned", n-after)
	}
}
