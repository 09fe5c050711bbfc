package lock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
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
		release: releasestore.NewBackend(cs, est, clk, records.DriverSecret),
		lease:   leasestore.NewBackend(cs, est, clk),
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

// TestIntegrationJointRetakesInOrder (issue 11 item 5, issue 13): a joint
// lock (record, then Lease) whose record lock was lost while it waited for
// the Lease (the release got installed and another client took the
// record's lock) gives the Lease back and takes both again in order, so it
// never waits for the record while it holds the Lease (a joint client
// holding the record and waiting for that Lease would wait for ever). The
// joint lock it returns is valid, every part freshly taken.
func TestIntegrationJointRetakesInOrder(t *testing.T) {
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
		j   *lock.Held
		err error
	}
	got := make(chan result, 1)
	go func() {
		j, err := lock.Acquire(ctx, request(ns, "web", lease), true, nil, a.release, a.lease)
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

	// B releases: A takes the Lease, finds its record lock gone, gives the
	// Lease back and waits for C's record lock.
	bStop()
	<-bDone
	if err := bHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, c.release, ns, "web", 1)

	// C holds the record for two of A's leases; A holds nothing meanwhile.
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
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Fatalf("Lease held by %q while A waited for the record; want it given back", *h)
	}
	cStop()
	<-cDone
	if err := cHeld.Release(ctx); err != nil {
		t.Fatal(err)
	}

	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire: %v", r.err)
	}
	defer func() { _ = r.j.Release(context.Background()) }()
	aSession := r.j.Session()
	l, err = env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName("web"), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != aSession {
		t.Errorf("the Lease after A got the joint lock: %+v (%v); want it held by A's %s", l.Spec, err, aSession)
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

// holdRecordLock installs revision 1 of release web as stock helm would and
// takes its record lock with a fresh client.
func holdRecordLock(t *testing.T, env *testenv.Env, ns string) (*client, *lock.Part) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, env, nil)
	h, _, err := c.release.TryAcquire(ctx, request(ns, "web", 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c, h
}

// lockOn reads the lock annotation of revision rev ("" when there is none)
// and the record's resourceVersion.
func lockOn(t *testing.T, env *testenv.Env, ns string, rev int) (string, string) {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), recordName("web", rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Annotations[lock.AnnotationRecord], s.ResourceVersion
}

// ourRecordOn writes h's current record onto revision rev as our fence does
// (helm's create of the next revision carries it; before helm prunes the
// newest record the lock is moved onto the next newest): create when the
// record does not exist yet, else a conditional update.
func ourRecordOn(t *testing.T, env *testenv.Env, ns string, h *lock.Part, rev int, status string) {
	t.Helper()
	if err := carryOnto(env, ns, h, rev, status); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationVanishedLockIsLost (issue 11 item 9): stock helm takes no
// lock; its rollback or uninstall rewrites, supersedes or deletes the
// release's newest record and the live lock on it vanishes. The holder must
// find out at its next renewal (ErrLost: the guard exits 4) and must not
// silently take the lock again, on that record or on an older one still
// carrying an old copy of its record. Moves of its own lock by its own
// fenced helm writes (onto a new revision, or back onto the next newest
// record before helm prunes the newest) stay its lock.
func TestIntegrationVanishedLockIsLost(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	secrets := func(ns string) interface {
		Update(context.Context, *corev1.Secret, metav1.UpdateOptions) (*corev1.Secret, error)
		Create(context.Context, *corev1.Secret, metav1.CreateOptions) (*corev1.Secret, error)
		Delete(context.Context, string, metav1.DeleteOptions) error
	} {
		return env.Client.CoreV1().Secrets(ns)
	}
	lost := func(t *testing.T, h *lock.Part) {
		t.Helper()
		err := h.Renew(ctx)
		if !errors.Is(err, lock.ErrLost) {
			t.Fatalf("Renew after the lock vanished = %v, want ErrLost", err)
		}
		t.Logf("holder told: %v", err)
		if err := h.Valid(); !errors.Is(err, lock.ErrLost) {
			t.Errorf("Valid after the lock vanished = %v, want ErrLost", err)
		}
	}

	t.Run("rewrite of the newest record", func(t *testing.T) {
		ns := env.Namespace(t)
		_, h := holdRecordLock(t, env, ns)
		// helm's Update: a rebuilt Secret, no resourceVersion, no
		// annotations (helm uninstall marks it uninstalling this way).
		if _, err := secrets(ns).Update(ctx, stockRecord(ns, "web", 1, "uninstalling"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, rv := lockOn(t, env, ns, 1)
		lost(t, h)
		if a, now := lockOn(t, env, ns, 1); a != "" || now != rv {
			t.Errorf("the record got a lock back: %q (resourceVersion %s, was %s)", a, now, rv)
		}
	})

	t.Run("stock rollback creates the next revision", func(t *testing.T) {
		ns := env.Namespace(t)
		_, h := holdRecordLock(t, env, ns)
		if _, err := secrets(ns).Create(ctx, stockRecord(ns, "web", 2, "pending-rollback"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		a1, rv1 := lockOn(t, env, ns, 1)
		lost(t, h)
		if a, _ := lockOn(t, env, ns, 2); a != "" {
			t.Errorf("revision 2 got a lock: %s", a)
		}
		if a, rv := lockOn(t, env, ns, 1); a != a1 || rv != rv1 {
			t.Errorf("revision 1 was written again (resourceVersion %s, was %s)", rv, rv1)
		}
	})

	t.Run("newest record deleted after our lock moved onto it", func(t *testing.T) {
		ns := env.Namespace(t)
		_, h := holdRecordLock(t, env, ns)
		// Our helm creates revision 2 with the lock; we renew there.
		ourRecordOn(t, env, ns, h, 2, "pending-upgrade")
		if err := h.Renew(ctx); err != nil {
			t.Fatalf("renewal after our own revision 2 took the lock: %v", err)
		}
		if a, _ := lockOn(t, env, ns, 2); a == "" {
			t.Fatal("revision 2 does not carry the lock")
		}
		// Someone else (stock helm's uninstall purging the history, a
		// person) deletes revision 2: revision 1 still carries an old copy
		// of our record, and it is not our lock any more.
		a1, rv1 := lockOn(t, env, ns, 1)
		if err := secrets(ns).Delete(ctx, recordName("web", 2), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lost(t, h)
		if a, rv := lockOn(t, env, ns, 1); a != a1 || rv != rv1 {
			t.Errorf("the lock was taken again on revision 1 (resourceVersion %s, was %s): %s", rv, rv1, a)
		}
	})

	t.Run("our own moves stay ours", func(t *testing.T) {
		ns := env.Namespace(t)
		c, h := holdRecordLock(t, env, ns)
		b := c.release
		ourRecordOn(t, env, ns, h, 2, "failed")
		if err := h.Renew(ctx); err != nil {
			t.Fatalf("renewal after our own revision 2 took the lock: %v", err)
		}
		// helm prunes revision 2 (not the last deployed): the fence first
		// moves our lock back onto revision 1.
		ourRecordOn(t, env, ns, h, 1, "deployed")
		if err := secrets(ns).Delete(ctx, recordName("web", 2), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := h.Renew(ctx); err != nil {
			t.Fatalf("renewal after our fence moved the lock back onto revision 1: %v", err)
		}
		before := h.Record().RenewedAt
		if err := h.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		a, _ := lockOn(t, env, ns, 1)
		if rec, err := lock.DecodeRecord(a); err != nil || rec.Session != h.Session() {
			t.Errorf("lock on revision 1 = %+v, %v; want ours", rec, err)
		}
		st, err := b.Inspect(ctx, ns, "web")
		if err != nil || st.Record == nil || st.Record.Session != h.Session() || st.Record.RenewedAt.Before(before) || st.State != lock.Live {
			t.Errorf("lock as judged = %+v, %v; want our renewal, live", st, err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// loseAnswer lets the first request that match selects through to the API
// server, then throws its answer away and answers 504 Gateway Timeout, as a
// proxy whose upstream answered too late does: the write committed, the
// client cannot know.
type loseAnswer struct {
	next  http.RoundTripper
	match func(*http.Request) bool
	mu    sync.Mutex
	armed bool
	// sent is the local time just before the lost request was sent.
	sent time.Time
}

func (l *loseAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	lose := l.armed && l.match(r)
	if lose {
		l.armed = false
		l.sent = time.Now()
	}
	l.mu.Unlock()
	resp, err := l.next.RoundTrip(r)
	if !lose || err != nil {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return &http.Response{
		Status: "504 Gateway Timeout", StatusCode: http.StatusGatewayTimeout,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"text/plain"}},
		Body:    io.NopCloser(strings.NewReader("upstream request timeout")),
		Request: r,
	}, nil
}

func (l *loseAnswer) sentAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent
}

// TestIntegrationLostAnswerTakeIsAdopted (issue 11 item 7): a take of the
// lock that committed but whose answer was lost (504) leaves the lock named
// by the client's own session. The client must recognise it and hold the
// lock at once (not queue behind itself until its own lock expires, nor
// fail), with a renew deadline no later than that of a holder whose write
// committed when it was sent; and what it took over is what that write
// took over, not its own record.
func TestIntegrationLostAnswerTakeIsAdopted(t *testing.T) {
	env := testenv.Get(t)
	const lease = 6 * time.Second
	isWrite := func(method, resource string) func(*http.Request) bool {
		return func(r *http.Request) bool {
			return r.Method == method && strings.Contains(r.URL.Path, "/"+resource)
		}
	}
	cases := []struct {
		name    string
		backend func(*client) *lock.Backend
		// setup prepares the release; it returns the session of the
		// record the take finds (released), "" for none.
		setup func(t *testing.T, ns string) string
		lose  func(*http.Request) bool
	}{
		{
			name:    "lease create",
			backend: func(c *client) *lock.Backend { return c.lease },
			setup:   func(*testing.T, string) string { return "" },
			lose:    isWrite(http.MethodPost, "leases"),
		},
		{
			name:    "lease update",
			backend: func(c *client) *lock.Backend { return c.lease },
			setup: func(t *testing.T, ns string) string {
				h, _, err := newClient(t, env, nil).lease.TryAcquire(context.Background(), request(ns, "web", lease))
				if err != nil {
					t.Fatal(err)
				}
				if err := h.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				return h.Session()
			},
			lose: isWrite(http.MethodPut, "leases"),
		},
		{
			name:    "release record update",
			backend: func(c *client) *lock.Backend { return c.release },
			setup: func(t *testing.T, ns string) string {
				if _, err := env.Client.CoreV1().Secrets(ns).Create(context.Background(), stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				return ""
			},
			// The gate's write: a patch (a read and an update without the
			// patch right).
			lose: func(r *http.Request) bool {
				return (r.Method == http.MethodPatch || r.Method == http.MethodPut) && strings.Contains(r.URL.Path, "/secrets/sh.helm.release.v1.")
			},
		},
	}
	for _, tc := range cases {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s wait=%v", tc.name, wait), func(t *testing.T) {
				ns := env.Namespace(t)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				before := tc.setup(t, ns)
				lost := &loseAnswer{match: tc.lose}
				c := newClient(t, env, func(rt http.RoundTripper) http.RoundTripper { lost.next = rt; return lost })
				b := tc.backend(c)
				lost.mu.Lock()
				lost.armed = true
				lost.mu.Unlock()
				r := request(ns, "web", lease)
				r.Session = lock.NewSession()
				var h *lock.Part
				var err error
				if wait {
					h, err = b.Wait(ctx, r, nil)
				} else {
					h, _, err = b.TryAcquire(ctx, r)
				}
				sent := lost.sentAt()
				if sent.IsZero() {
					t.Fatal("no answer was lost: the test did not stage its fault")
				}
				if err != nil {
					t.Fatalf("acquire after its take's answer was lost: %v", err)
				}
				if h.Session() != r.Session {
					t.Fatalf("held session %s, want %s", h.Session(), r.Session)
				}
				if h.PreviousState == lock.Expired || (h.Previous != nil && h.Previous.Session == r.Session) {
					t.Errorf("took its own lock over as %v from %+v: it queued behind itself", h.PreviousState, h.Previous)
				}
				if before != "" && (h.Previous == nil || h.Previous.Session != before) {
					t.Errorf("previous = %+v, want the released record of %s", h.Previous, before)
				}
				if limit := sent.Add(lease - lock.RenewMargin); h.Deadline().After(limit) {
					t.Errorf("renew deadline %v is later than the lost write's send time + lease - margin (%v)", h.Deadline(), limit)
				}
				st, err := b.Inspect(ctx, ns, "web")
				if err != nil || st.HolderIdentity != r.Session || st.State != lock.Live {
					t.Fatalf("lock on the server = %+v, %v", st, err)
				}
				if err := h.Valid(); err != nil {
					t.Fatal(err)
				}
				if err := h.Renew(ctx); err != nil {
					t.Fatalf("renewing the adopted lock: %v", err)
				}
				if err := h.Release(ctx); err != nil {
					t.Fatalf("releasing the adopted lock: %v", err)
				}
			})
		}
	}
}

// TestIntegrationBeatDeletedKeepsLiveHolder: a live holder renews on the
// lock's beat, not on the gate it wrote at the take. When the beat is
// deleted (by hand, a cleanup job, a restore) or unreadable, the gate says
// nothing of the holder's renewals, and judging it by its take stamp would
// hand a live holder's release to another client (found by review). The
// gate is then judged by the bound it was written with: the second client
// is refused, and the holder keeps its lock.
func TestIntegrationBeatDeletedKeepsLiveHolder(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const lease = 3 * time.Second
	h, _, err := newClient(t, env, nil).release.TryAcquire(ctx, request(ns, "web", lease))
	if err != nil {
		t.Fatal(err)
	}
	taken := h.Record().RenewedAt
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	lost := make(chan error, 1)
	go h.Keep(kctx, func(err error) { lost <- err })
	b := newClient(t, env, nil)
	// Until the holder's renewals are past its take's LOCKED TILL (and
	// the margin), the take stamp alone would still say Live.
	deadline := time.Now().Add(time.Minute)
	for !h.Record().RenewedAt.After(taken.Add(lease + time.Second)) {
		if time.Now().After(deadline) {
			t.Fatal("the holder's renewals never passed its take's LOCKED TILL")
		}
		select {
		case err := <-lost:
			t.Fatalf("holder lost its lock: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, _, err := b.release.TryAcquire(ctx, request(ns, "web", lease)); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("a second client while the holder renews: %v, want ErrLocked", err)
	}
	if err := env.Client.CoreV1().Secrets(ns).Delete(ctx, lock.LeaseName("web"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if hb, _, err := b.release.TryAcquire(ctx, request(ns, "web", lease)); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("with the beat deleted, a second client got %v (held: %v); want ErrLocked: the holder is alive", err, hb != nil)
	}
	if err := h.Valid(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	stop()
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("the holder's next renewal (writes the beat anew): %v", err)
	}
}
