package lock_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// beforePut runs hook once, just before the first PUT of the object named
// name leaves (a renewal's write of the lock's beat, after the release
// store has read the gate and the beat).
type beforePut struct {
	next  http.RoundTripper
	name  string
	mu    sync.Mutex
	armed bool
	hook  func()
}

func (b *beforePut) arm() {
	b.mu.Lock()
	b.armed = true
	b.mu.Unlock()
}

func (b *beforePut) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	fire := b.armed && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+b.name)
	if fire {
		b.armed = false
	}
	b.mu.Unlock()
	if fire {
		b.hook()
	}
	return b.next.RoundTrip(r)
}

// carryOnto copies h's record onto revision rev as the fence does, through
// part.Carry: create when the record does not exist yet (helm's create of
// the next revision), else a conditional update (the move before helm
// prunes the newest record).
func carryOnto(env *testenv.Env, ns string, h *lock.Part, rev int, status string) error {
	return h.Carry(func(rec lock.Record) error {
		ctx := context.Background()
		rec.Revision = rev
		s, err := rec.Encode()
		if err != nil {
			return err
		}
		secrets := env.Client.CoreV1().Secrets(ns)
		cur, err := secrets.Get(ctx, recordName("web", rev), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			sec := stockRecord(ns, "web", rev, status)
			sec.Annotations = map[string]string{lock.AnnotationRecord: s}
			_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[lock.AnnotationRecord] = s
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// TestIntegrationCarryWaitsForRenewal: helm's fenced create of revision 2
// starts while the holder's renewal, having found revision 1 newest, is
// about to write it. Were the create to copy the record as it stood then
// (the previous renewal), the lock that counts (on revision 2) would end
// earlier than the deadline the holder goes by after the renewal, and a
// client could take it over while the holder still writes: two writers
// (found by review; the create copied part.Record() with no ordering).
// Through part.Carry the copy waits for the renewal and carries it.
func TestIntegrationCarryWaitsForRenewal(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var h *lock.Part
	created := make(chan error, 1)
	bp := &beforePut{name: lock.LeaseName("web")}
	bp.hook = func() {
		go func() { created <- carryOnto(env, ns, h, 2, "pending-upgrade") }()
	}
	a := newClient(t, env, func(rt http.RoundTripper) http.RoundTripper { bp.next = rt; return bp })
	var err error
	h, _, err = a.release.TryAcquire(ctx, request(ns, "web", 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	bp.arm()
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if err := receive(t, created); err != nil {
		t.Fatalf("fenced create of revision 2: %v", err)
	}
	on2, _ := lockOn(t, env, ns, 2)
	rec2, err := lock.DecodeRecord(on2)
	if err != nil {
		t.Fatal(err)
	}
	if held := h.Record(); !rec2.RenewedAt.Equal(held.RenewedAt) || rec2.Session != held.Session {
		t.Fatalf("revision 2 carries %s renewed %s; the holder goes by its renewal, renewed %s",
			rec2.Session, rec2.RenewedAt.Format(time.RFC3339Nano), held.RenewedAt.Format(time.RFC3339Nano))
	}
	// The lock moved with the create: the next renewal goes on from there.
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("renewal on revision 2: %v", err)
	}
}

// TestIntegrationCarryBeforePruneIsNoLoss: before helm prunes the newest
// record (revision 2, where the lock is), the fence moves the lock onto
// revision 1 while a renewal that listed revision 2 newest is about to
// write it. Were the move to copy the record as it stood (before that
// renewal), revision 1 would carry an older copy of the lock once helm
// deletes revision 2, and the next renewal would take the lock for lost
// although nobody else touched it (found by review). Through part.Carry the
// move carries the renewal.
func TestIntegrationCarryBeforePruneIsNoLoss(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var h *lock.Part
	moved := make(chan error, 1)
	bp := &beforePut{name: lock.LeaseName("web")}
	bp.hook = func() {
		go func() { moved <- carryOnto(env, ns, h, 1, "deployed") }()
	}
	a := newClient(t, env, func(rt http.RoundTripper) http.RoundTripper { bp.next = rt; return bp })
	var err error
	h, _, err = a.release.TryAcquire(ctx, request(ns, "web", 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := carryOnto(env, ns, h, 2, "failed"); err != nil { // our helm's create of revision 2
		t.Fatal(err)
	}
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	bp.arm()
	if err := h.Renew(ctx); err != nil { // races the move onto revision 1
		t.Fatalf("renewal: %v", err)
	}
	if err := receive(t, moved); err != nil {
		t.Fatalf("moving the lock onto revision 1: %v", err)
	}
	// helm's delete of revision 2, after the fence moved the lock.
	if err := env.Client.CoreV1().Secrets(ns).Delete(ctx, recordName("web", 2), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("false loss: nobody else touched the lock, but the renewal says: %v", err)
	}
	on1, _ := lockOn(t, env, ns, 1)
	if !strings.Contains(on1, fmt.Sprintf("%q", h.Session())) {
		t.Fatalf("revision 1 carries %s; want our lock", on1)
	}
}

// receive waits for the hooked write's result, failing the test when the
// hook never fired.
func receive(t *testing.T, c <-chan error) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the hooked write never ran: the renewal wrote no beat")
		return nil
	}
}

// TestIntegrationCarryWritesTheGateForm: what helm's record write carries
// through part.Carry is the lock in the gate's form: it names its beat,
// where the holder renews, and its LOCKED TILL is the long bound a reader
// goes by when the beat says nothing of the holder (its maximum hold plus
// a lease, or a day without one), never the holder's own, which only its
// renewals on the beat move. Carried as the holder's own record, the gate
// would end one lease after the take: a reader that finds the beat silent
// would take the lock over while the holder still renews and writes.
func TestIntegrationCarryWritesTheGateForm(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	_, h := holdRecordLock(t, env, ns)
	if err := carryOnto(env, ns, h, 2, "pending-upgrade"); err != nil {
		t.Fatal(err)
	}
	on2, _ := lockOn(t, env, ns, 2)
	gate, err := lock.DecodeRecord(on2)
	if err != nil {
		t.Fatal(err)
	}
	held := h.Record()
	want := held.RenewedAt.Add(24 * time.Hour)
	if !held.MaxHoldUntil.IsZero() {
		want = held.MaxHoldUntil
		if held.RenewedAt.After(want) {
			want = held.RenewedAt
		}
		want = want.Add(held.LeaseDuration.Duration)
	}
	if gate.Liveness != lock.LeaseName("web") || !gate.LockedTill.Equal(want) || gate.Session != held.Session {
		t.Fatalf("revision 2 carries session %s, liveness %q, LOCKED TILL %s; want %s, %q, %s (the holder's own: %s)",
			gate.Session, gate.Liveness, gate.LockedTill.Format(time.RFC3339Nano), held.Session, lock.LeaseName("web"),
			want.Format(time.RFC3339Nano), held.LockedTill.Format(time.RFC3339Nano))
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
