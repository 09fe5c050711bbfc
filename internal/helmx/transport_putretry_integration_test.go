package helmx

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"

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
	for _, c := range []struct {
		name string
		fail func(w http.ResponseWriter, r *http.Request, forward http.Handler)
	}{
		{"503 before it lands", func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		}},
		{"connection reset before it lands", func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}},
		{"answer lost after it landed", func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
			forward.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := env.Namespace(t)
			var puts, failed atomic.Int32
			cfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
				if r.Method == http.MethodPut && puts.Add(1) == 1 {
					failed.Add(1)
					c.fail(w, r, forward)
					return
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
			if failed.Load() != 1 || puts.Load() != 2 {
				t.Errorf("%d update(s) sent, %d failed; want the failed one sent again once", puts.Load(), failed.Load())
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
