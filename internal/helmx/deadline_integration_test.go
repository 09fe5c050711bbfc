package helmx

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// holdingProxy sits in front of the real API server and holds the requests
// hold selects until the test releases them, as the API server's priority
// and fairness queues or a slow admission webhook do: after the server has
// read the request and set its deadline from the timeout parameter (the
// request deadline filter, which runs before both). A held request is then
// forwarded under that deadline and its client's connection: what a client
// gave up on, or what outlived its timeout, is not written.
type holdingProxy struct {
	cfg *rest.Config
	// arrived receives the query of each held request as it arrives.
	arrived chan url.Values
	release chan struct{}
	once    sync.Once
	// inFlight counts held requests not yet forwarded (or refused).
	inFlight sync.WaitGroup
	// givenUp is closed once a held request's deadline (its timeout
	// parameter, from its arrival) has passed or its client went away.
	givenUp     chan struct{}
	givenUpOnce sync.Once
}

func newHoldingProxy(t *testing.T, env *testenv.Env, hold func(*http.Request) bool) *holdingProxy {
	t.Helper()
	p := &holdingProxy{arrived: make(chan url.Values, 16), release: make(chan struct{}), givenUp: make(chan struct{})}
	p.cfg = env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if hold(r) {
			p.inFlight.Add(1)
			defer p.inFlight.Done()
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			ctx := r.Context()
			if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			go func() {
				<-ctx.Done()
				p.givenUpOnce.Do(func() { close(p.givenUp) })
			}()
			p.arrived <- r.URL.Query()
			<-p.release
			r = r.WithContext(ctx)
		}
		forward.ServeHTTP(w, r)
	})
	// Cleanups run last registered first: held requests are let go before
	// the server closes.
	t.Cleanup(p.Release)
	return p
}

// ReleaseGivenUp lets the held requests through once one of them has been
// given up (its server-side deadline passed, or its client went away), as
// a queue in the API server would after the deadline it set on arrival:
// the deadline runs from the proxy's arrival, a little after the client
// sent it, so letting it through at the client's cut-off would race.
func (p *holdingProxy) ReleaseGivenUp(t *testing.T) {
	t.Helper()
	select {
	case <-p.givenUp:
	case <-time.After(60 * time.Second):
		t.Errorf("no held request was given up within 60s of the cut-off")
	}
	p.Release()
}

// Release lets every held request (and every later one) through.
func (p *holdingProxy) Release() { p.once.Do(func() { close(p.release) }) }

// fencedClient is a clientset on cfg whose writes go through a fence
// guarding release "web" in ns under l.
func fencedClient(t *testing.T, cfg *rest.Config, ns string, l HelmLock) kubernetes.Interface {
	t.Helper()
	w := &WriteFence{}
	t.Cleanup(w.Guard(GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: l}))
	cs, err := kubernetes.NewForConfig(w.Wrap(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// awaitCutOff waits for the result of a fenced write the proxy holds. The
// fence must end it by itself at the lock's deadline; a write still in
// flight well past that is let through, so that a fence without deadlines
// fails the test (the write then lands) instead of hanging it.
func awaitCutOff(t *testing.T, p *holdingProxy, deadline time.Time, errc <-chan error) error {
	t.Helper()
	grace := time.NewTimer(time.Until(deadline) + 20*time.Second)
	defer grace.Stop()
	select {
	case err := <-errc:
		return err
	case <-grace.C:
		t.Errorf("the write was still in flight 20s after the lock's renew deadline; letting it through")
		p.Release()
		return <-errc
	}
}

// checkServerTimeout: the held write carried the API server's own request
// timeout, no longer than the lock had left when it was sent.
func checkServerTimeout(t *testing.T, q url.Values, lease time.Duration) {
	t.Helper()
	d, err := time.ParseDuration(q.Get("timeout"))
	if err != nil || d <= 0 || d > lease {
		t.Errorf("the write's timeout parameter is %q; want a duration in (0, %s]", q.Get("timeout"), lease)
	}
}

// TestIntegrationFenceCutsChartWriteAtDeadline: a write of a chart object
// held up on its way (API priority and fairness, a slow webhook; here a
// proxy) past the lock's renew deadline fails with ErrLost, and the object
// is not written when the held request is let through afterwards.
func TestIntegrationFenceCutsChartWriteAtDeadline(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	p := newHoldingProxy(t, env, func(r *http.Request) bool {
		return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/configmaps")
	})
	const lease = 2 * time.Second
	held := newHeld("slow-session", time.Now())
	held.deadline = time.Now().Add(lease)
	cs := fencedClient(t, p.cfg, ns, held)

	errc := make(chan error, 1)
	go func() {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "chart-object"}, Data: map[string]string{"k": "v"}}
		_, err := cs.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{})
		errc <- err
	}()
	checkServerTimeout(t, <-p.arrived, lease)
	err := awaitCutOff(t, p, held.deadline, errc)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("a chart write held past the lock's renew deadline: %v; want an error wrapping ErrLost", err)
	}
	p.ReleaseGivenUp(t)
	p.inFlight.Wait()
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), "chart-object", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the chart object after its cut-off write was let through: %v; want NotFound (written after the lock's deadline)", err)
	}
}

// TestIntegrationFenceCutsRecordWriteAtDeadline: helm's update of a release
// record held up past the lock's renew deadline fails with ErrLost and
// leaves the record as it was.
func TestIntegrationFenceCutsRecordWriteAtDeadline(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	held := newHeld("slow-session", time.Now())
	// Our own create of revision 1: it carries our lock.
	if err := store(t, fencedDriver(t, env.Config, ns, held), 1, common.StatusPendingInstall); err != nil {
		t.Fatal(err)
	}
	p := newHoldingProxy(t, env, func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets/"+ReleaseSecretName("web", 1))
	})
	const lease = 2 * time.Second
	held.deadline = time.Now().Add(lease)
	d := driver.NewSecrets(fencedClient(t, p.cfg, ns, held).CoreV1().Secrets(ns))

	errc := make(chan error, 1)
	go func() { errc <- d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed)) }()
	checkServerTimeout(t, <-p.arrived, lease)
	err := awaitCutOff(t, p, held.deadline, errc)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("helm's update held past the lock's renew deadline: %v; want an error wrapping ErrLost", err)
	}
	p.ReleaseGivenUp(t)
	p.inFlight.Wait()
	if st := env.History(t, ns, "web")[0].Status; st != string(common.StatusPendingInstall) {
		t.Fatalf("revision 1 after the cut-off update was let through is %s; want it untouched (pending-install)", st)
	}
}

// TestIntegrationFenceCutStopsTheOperation: once the renew deadline cut off
// one of helm's writes, a later write of the same operation is refused even
// when a renewal made the lock valid again meanwhile. helm goes on after
// some failed writes (marking the previous revision superseded), and would
// otherwise write its revision deployed beside it (internal/sim, seed 435).
func TestIntegrationFenceCutStopsTheOperation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	held := newHeld("cut-session", time.Now())
	if err := store(t, fencedDriver(t, env.Config, ns, held), 1, common.StatusPendingInstall); err != nil {
		t.Fatal(err)
	}
	var puts atomic.Int32
	p := newHoldingProxy(t, env, func(r *http.Request) bool {
		// Hold helm's first update of revision 1 only.
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets/"+ReleaseSecretName("web", 1)) && puts.Add(1) == 1
	})
	const lease = 2 * time.Second
	held.deadline = time.Now().Add(lease)
	d := driver.NewSecrets(fencedClient(t, p.cfg, ns, held).CoreV1().Secrets(ns))

	errc := make(chan error, 1)
	go func() { errc <- d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)) }()
	<-p.arrived
	if err := awaitCutOff(t, p, held.deadline, errc); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("helm's update held past the lock's renew deadline: %v; want an error wrapping ErrLost", err)
	}
	p.ReleaseGivenUp(t)
	p.inFlight.Wait()

	// A renewal lands: the lock is valid again.
	held.deadline = time.Now().Add(time.Minute)
	if err := held.Valid(); err != nil {
		t.Fatalf("the renewed lock: %v", err)
	}
	err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed))
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("helm's next write after a cut-off one: %v; want it refused with an error wrapping ErrLost", err)
	}
	if st := env.History(t, ns, "web")[0].Status; st != string(common.StatusPendingInstall) {
		t.Fatalf("revision 1 after a write that followed a cut-off one is %s; want it untouched (pending-install)", st)
	}
}

// TestIntegrationFenceStopsAfterAFailedSupersede: helm only logs the
// failure of its write marking the previous revision superseded, and goes
// on to write its own revision deployed: two revisions would then read
// deployed (internal/sim, seeds 35818 and 36433). Once that write failed
// (after the fence's own retries), every later write of the operation is
// refused: the previous revision stays deployed and the new one pending,
// for its holder to mark failed.
func TestIntegrationFenceStopsAfterAFailedSupersede(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	held := newHeld("supersede-session", time.Now())
	if err := store(t, fencedDriver(t, env.Config, ns, held), 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	cfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets/"+ReleaseSecretName("web", 1)) {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`, http.StatusForbidden)
			return
		}
		forward.ServeHTTP(w, r)
	})
	d := fencedDriver(t, cfg, ns, held)
	if err := store(t, d, 2, common.StatusPendingUpgrade); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); err == nil {
		t.Fatal("the update of revision 1 went through the failing proxy")
	}
	if err := d.Update(ReleaseSecretName("web", 2), webRelease(2, common.StatusDeployed)); err == nil || !strings.Contains(err.Error(), "superseded failed") {
		t.Fatalf("helm's write of its revision deployed after its supersede failed: %v; want it refused, naming the failed supersede", err)
	}
	var got []string
	for _, s := range env.History(t, ns, "web") {
		got = append(got, s.Status)
	}
	if want := []string{string(common.StatusDeployed), string(common.StatusPendingUpgrade)}; !slices.Equal(got, want) {
		t.Fatalf("history = %v; want %v (one deployed revision)", got, want)
	}
}
