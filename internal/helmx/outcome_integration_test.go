package helmx

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// faultProxy sits in front of the real API server; fault answers a request
// itself when it returns true, otherwise the request goes through.
func faultProxy(t *testing.T, env *testenv.Env, fault func(http.ResponseWriter, *http.Request) bool) *rest.Config {
	t.Helper()
	return env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if !fault(w, r) {
			forward.ServeHTTP(w, r)
		}
	})
}

// once makes a fault that answers the first request match selects with
// code (and Retry-After retryAfter, unless empty), and lets every other
// request through.
func once(match func(*http.Request) bool, code int, retryAfter string) (func(http.ResponseWriter, *http.Request) bool, *atomic.Bool) {
	var done atomic.Bool
	return func(w http.ResponseWriter, r *http.Request) bool {
		if !match(r) || !done.CompareAndSwap(false, true) {
			return false
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by the test","code":`+strconv.Itoa(code)+`}`)
		return true
	}, &done
}

// reportingLock is a heldLock that records the fence's reports of its own
// revision records (OwnRecordReporter).
type reportingLock struct {
	*heldLock
	mu      sync.Mutex
	reports []string
}

func (r *reportingLock) OwnRecordWrite(rev int, settled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := "pending"
	if settled {
		s = "settled"
	}
	r.reports = append(r.reports, ReleaseSecretName("web", rev)+" "+s)
}

func (r *reportingLock) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reports)
}

// TestIntegrationFenceListRetriesThrottling: a 429 answer to the fence's
// own list of the release's records (API priority and fairness) is retried
// as client-go retries its own requests, instead of failing helm's write
// with a transport error client-go does not retry.
func TestIntegrationFenceListRetriesThrottling(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, plain, 1, common.StatusPendingInstall); err != nil {
		t.Fatal(err)
	}
	fault, hit := once(func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/secrets") && r.URL.Query().Get("labelSelector") != ""
	}, http.StatusTooManyRequests, "0")
	held := newHeld("throttled-session", time.Now())
	held.deadline = time.Now().Add(time.Minute)
	taken(t, env, ns, 1, held)
	d := driver.NewSecrets(fencedClient(t, faultProxy(t, env, fault), ns, held).CoreV1().Secrets(ns))
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed)); err != nil {
		t.Fatalf("helm's update after the fence's list was throttled once: %v", err)
	}
	if !hit.Load() {
		t.Fatal("the fence's list was never throttled; the test checks nothing")
	}
	if st := env.History(t, ns, "web")[0].Status; st != string(common.StatusDeployed) {
		t.Errorf("revision 1 is %s; want deployed", st)
	}
}

// TestIntegrationFenceReportsOwnRecordWrites: the fence tells the lock how
// each write of the holder's own revision record ended: the create of a
// pending revision leaves it unsettled, a final write refused (403, which
// sending again does not cure; one answered 5xx is sent again) leaves it
// unsettled, the final write that succeeds
// settles it. Writes of other revisions are not reported.
func TestIntegrationFenceReportsOwnRecordWrites(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, plain, 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	fault, hit := once(func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets/"+ReleaseSecretName("web", 2))
	}, http.StatusForbidden, "")
	held := &reportingLock{heldLock: newHeld("reporting-session", time.Now())}
	taken(t, env, ns, 1, held)
	held.rec.Revision = 2
	d := driver.NewSecrets(fencedClient(t, faultProxy(t, env, fault), ns, held).CoreV1().Secrets(ns))
	if err := store(t, d, 2, common.StatusPendingUpgrade); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 2), webRelease(2, common.StatusDeployed)); err == nil || !hit.Load() {
		t.Fatalf("the final write answered 403: %v; want it to fail", err)
	}
	if got, want := held.got(), []string{"sh.helm.release.v1.web.v2 pending", "sh.helm.release.v1.web.v2 pending"}; !slices.Equal(got, want) {
		t.Errorf("reports after the failed final write: %q; want %q", got, want)
	}
	if err := d.Update(ReleaseSecretName("web", 2), webRelease(2, common.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
	if got := held.got(); len(got) != 3 || got[2] != "sh.helm.release.v1.web.v2 settled" {
		t.Errorf("reports after the final write succeeded: %q; want it settled last", got)
	}
}
