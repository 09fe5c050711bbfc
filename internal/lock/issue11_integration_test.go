package lock_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// client is one independent process's connection: both of its backends
// share its clientset, server-time estimator and clock, as the CLI's do.
type client struct {
	cs      kubernetes.Interface
	release *lock.Backend
	lease   *lock.Backend
}

// newClient connects one client; wrap, when not nil, wraps its transport
// outside the server-time estimator (so the estimator sees every real
// response).
func newClient(t *testing.T, env *testenv.Env, wrap func(http.RoundTripper) http.RoundTripper) *client {
	t.Helper()
	clk := skewedClock{}
	est := servertime.New(clk)
	cfg := est.Instrument(env.Config)
	if wrap != nil {
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(wrap)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := est.Sync(context.Background(), cs.Discovery()); err != nil {
		t.Fatal(err)
	}
	return &client{
		cs:      cs,
		release: lock.NewReleaseBackend(cs, est, clk, records.DriverSecret),
		lease:   lock.NewLeaseBackend(cs, est, clk),
	}
}

func recordName(release string, rev int) string {
	return fmt.Sprintf("sh.helm.release.v1.%s.v%d", release, rev)
}

// stockRecord is revision rev of release as stock helm writes it: helm's
// labels, a payload, no annotations.
func stockRecord(ns, release string, rev int, status string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      recordName(release, rev),
			Namespace: ns,
			Labels: map[string]string{
				"owner": "helm", "name": release, "version": fmt.Sprint(rev), "status": status,
			},
		},
		Type: "helm.sh/release.v1",
		Data: map[string][]byte{records.DataKey: []byte("H4sI-payload-" + status)},
	}
}

// waitFor polls cond until it holds, failing the test after a generous
// limit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIntegrationJointKeepsLeaseWhileRetakingRecord (issue 11 item 5): a
// joint lock (record, then Lease) whose record lock was lost while it waited
// for the Lease (the release got installed and another client took the
// record's lock) waits for the record again while it holds the Lease. The
// Lease must be renewed during that wait: the joint lock it returns is valid,
// its Lease renewed, not one already past its renew deadline.
func TestIntegrationJointKeepsLeaseWhileRetakingRecord(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const lease = 3 * time.Second

	// B holds the Lease, renewing it.
	b := newClient(t, env, nil)
	bHeld, _, err := b.lease.TryAcquire(ctx, request(ns, "web", lease))
	if err != nil {
		t.Fatal(err)
	}
	bCtx, bStop := context.WithCancel(ctx)
	bDone := make(chan struct{})
	go func() { defer close(bDone); bHeld.Keep(bCtx, nil) }()

	// A wants both: the release has no record yet, so its record lock is
	// virtual, and it queues for the Lease.
	a := newClient(t, env, nil)
	type result struct {
		j   *lock.Joint
		err error
	}
	got := make(chan result, 1)
	go func() {
		j, err := lock.AcquireJoint(ctx, request(ns, "web", lease), true, nil, a.release, a.lease)
		got <- result{j, err}
	}()
	waitQueued(t, b.lease, ns, "web", 1)

	// The release gets installed meanwhile and C takes its record's lock.
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, env, nil)
	cHeld, _, err := c.release.TryAcquire(ctx, request(ns, "web", lease))
	if err != nil {
		t.Fatal(err)
	}
	cCtx, cStop := context.WithCancel(ctx)
	cDone := make(chan struct{})
	go func() { defer close(cDone); cHeld.Keep(cCtx, nil) }()

	// B releases: A takes the Lease, finds its record lock gone and waits
	// for C's while holding the Lease.
	bStop()
	<-bDone
	if err := bHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var aSession string
	var tookRenew time.Time
	waitFor(t, "A to hold the Lease", func() bool {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName("web"), metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || *l.Spec.HolderIdentity == bHeld.Session() {
			return false
		}
		aSession, tookRenew = *l.Spec.HolderIdentity, l.Spec.RenewTime.Time
		return true
	})
	waitQueued(t, c.release, ns, "web", 1)

	// C holds the record for two of A's leases.
	end := time.Now().Add(2 * lease)
	for time.Now().Before(end) {
		select {
		case r := <-got:
			t.Fatalf("A finished while C still held the record lock: %v, %v", r.j, r.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName("web"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := *l.Spec.HolderIdentity; h != aSession {
		t.Fatalf("Lease holder %q while A waited for the record, want A's %q", h, aSession)
	}
	if !l.Spec.RenewTime.After(tookRenew) {
		t.Errorf("A's Lease was not renewed while A waited for the record (renewTime still %v after %v)", l.Spec.RenewTime.Time, 2*lease)
	}
	cStop()
	<-cDone
	if err := cHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}

	r := <-got
	if r.err != nil {
		t.Fatalf("AcquireJoint: %v", r.err)
	}
	defer func() { _ = r.j.Release(context.Background()) }()
	if r.j.Session() != aSession {
		t.Errorf("joint session %s, Lease held by %s", r.j.Session(), aSession)
	}
	if err := r.j.Valid(); err != nil {
		t.Fatalf("the joint lock A got is not valid: %v", err)
	}
	if err := r.j.Renew(ctx); err != nil {
		t.Fatalf("renewing the joint lock A got: %v", err)
	}
	if st, err := c.release.Inspect(ctx, ns, "web"); err != nil || st.HolderIdentity != aSession {
		t.Errorf("record lock after A got it: %+v, %v", st, err)
	}
}
