package lock

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// casSecrets: in-memory Secrets with resourceVersions and CAS.
type casSecrets struct {
	mu   sync.Mutex
	rv   int
	objs map[string]*corev1.Secret
}

func (s *casSecrets) react(a k8stesting.Action) (bool, runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gr := corev1.Resource("secrets")
	switch a.GetVerb() {
	case "get":
		a := a.(k8stesting.GetAction)
		o := s.objs[a.GetName()]
		if o == nil {
			return true, nil, apierrors.NewNotFound(gr, a.GetName())
		}
		return true, o.DeepCopy(), nil
	case "list":
		a := a.(k8stesting.ListAction)
		sel := a.GetListRestrictions().Labels
		out := &corev1.SecretList{}
		for _, o := range s.objs {
			if sel == nil || sel.Matches(labels.Set(o.Labels)) {
				out.Items = append(out.Items, *o.DeepCopy())
			}
		}
		out.ResourceVersion = strconv.Itoa(s.rv)
		return true, out, nil
	case "create":
		a := a.(k8stesting.CreateAction)
		o := a.GetObject().(*corev1.Secret).DeepCopy()
		if s.objs[o.Name] != nil {
			return true, nil, apierrors.NewAlreadyExists(gr, o.Name)
		}
		s.rv++
		o.ResourceVersion = strconv.Itoa(s.rv)
		o.UID = types.UID("uid-" + o.ResourceVersion)
		o.ManagedFields = nil
		s.objs[o.Name] = o
		return true, o.DeepCopy(), nil
	case "update":
		a := a.(k8stesting.UpdateAction)
		o := a.GetObject().(*corev1.Secret).DeepCopy()
		cur := s.objs[o.Name]
		if cur == nil {
			return true, nil, apierrors.NewNotFound(gr, o.Name)
		}
		if o.ResourceVersion != "" && o.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(gr, o.Name, errors.New("modified"))
		}
		s.rv++
		o.ResourceVersion = strconv.Itoa(s.rv)
		o.UID = cur.UID
		o.ManagedFields = nil
		s.objs[o.Name] = o
		return true, o.DeepCopy(), nil
	case "delete":
		a := a.(k8stesting.DeleteAction)
		delete(s.objs, a.GetName())
		return true, nil, nil
	}
	return false, nil, nil
}

func recSecret(rev int, status string, ann map[string]string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: "sh.helm.release.v1.web.v" + strconv.Itoa(rev), Namespace: ns,
		Labels:      map[string]string{"owner": "helm", "name": "web", "version": strconv.Itoa(rev), "status": status},
		Annotations: ann,
	}, Type: "helm.sh/release.v1", Data: map[string][]byte{records.DataKey: []byte("x")}}
}

type rworld struct {
	cs  *fake.Clientset
	s   *casSecrets
	clk *clocktesting.FakeClock
	b   *Backend
}

func newRWorld(t *testing.T) *rworld {
	s := &casSecrets{objs: map[string]*corev1.Secret{}}
	cs := fake.NewClientset()
	cs.PrependReactor("*", "secrets", s.react)
	clk := clocktesting.NewFakeClock(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0.Truncate(time.Second))
	b := fakeClocked(NewReleaseBackend(cs, est, clk, records.DriverSecret))
	b.Margin = time.Second
	ctx := context.Background()
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, recSecret(1, "deployed", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &rworld{cs: cs, s: s, clk: clk, b: b}
}

// carry creates (or rewrites) revision rev with h's record, as the fence does.
func (w *rworld) carry(t *testing.T, h *part, rev int) {
	err := h.Carry(func(rec Record) error {
		rec.Revision = rev
		enc, _ := rec.Encode()
		ctx := context.Background()
		cur, err := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v"+strconv.Itoa(rev), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = w.cs.CoreV1().Secrets(ns).Create(ctx, recSecret(rev, "pending-upgrade", map[string]string{AnnotationRecord: enc}), metav1.CreateOptions{})
			return err
		}
		cur.Annotations[AnnotationRecord] = enc
		_, err = w.cs.CoreV1().Secrets(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// takeAndRelease takes the lock with a session of its own and releases it
// (a beat then exists, naming a released holder).
func (w *rworld) takeAndRelease(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// verbsSince returns the verbs of the client's requests after the first n.
func (w *rworld) verbsSince(n int) []string {
	var verbs []string
	for _, a := range w.cs.Actions()[n:] {
		verbs = append(verbs, a.GetVerb())
	}
	return verbs
}

func (w *rworld) beat(t *testing.T) *corev1.Secret {
	b, err := w.cs.CoreV1().Secrets(ns).Get(context.Background(), LeaseName("web"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNewestDeletedUnderHolderIsLost: the newest record, onto which the
// holder's lock moved with its own create, is deleted by someone else; the
// gate falls back to an older record with an older copy of the holder's
// record, and the holder's next renewal reports the lock lost (the unit
// mirror of TestIntegrationVanishedLockIsLost's subtest).
func TestNewestDeletedUnderHolderIsLost(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w.carry(t, h, 2)
	w.clk.Step(time.Second)
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("renew after own create: %v", err)
	}
	if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.clk.Step(time.Second)
	err = h.Renew(ctx)
	t.Logf("Renew after revision 2 was deleted by someone else: %v", err)
	if !errors.Is(err, ErrLost) {
		t.Errorf("want ErrLost, got %v", err)
	}
}

// TestStaleQueueWriteAfterGateMovedConflicts: a waiter's queue write from a
// view read before the holder's fenced create moved the gate carries the
// holder's record but is not the holder's own write: it conflicts rather
// than rewrite the beat as the holder's heartbeat (erasing a person's
// release mark), and the holder still learns it was released.
func TestStaleQueueWriteAfterGateMovedConflicts(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	st := w.b.store(ns)
	// unlock --force's first step: the beat is marked released (its gate
	// write has not landed yet).
	bt := w.beat(t)
	rec := decodeBeat(bt.Annotations[Stores.AnnotationBeat], "web", ns)
	rec.ReleasedAt = t0.Add(time.Second)
	rec.ReleasedBy = "alice"
	enc, _ := encodeBeat(*rec)
	bt.Annotations[Stores.AnnotationBeat] = enc
	delete(bt.Annotations, Stores.AnnotationClaimedFrom)
	if _, err := w.cs.CoreV1().Secrets(ns).Update(ctx, bt, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The waiter reads the lock.
	seen, err := st.Read(ctx, LeaseName("web"))
	if err != nil {
		t.Fatal(err)
	}
	before := w.beat(t).Annotations[Stores.AnnotationBeat]
	// The holder's fenced create of revision 2 (gate moves, beat untouched).
	w.carry(t, h, 2)
	// The waiter's enqueue from its view.
	_, err = st.Enqueue(ctx, seen, []Waiter{{Session: "W", Who: "w", EnqueuedAt: t0, HeartbeatAt: t0, ExpiresAt: t0.Add(time.Minute)}})
	after := w.beat(t).Annotations[Stores.AnnotationBeat]
	t.Logf("enqueue err=%v\nbeat before: %s\nbeat after:  %s", err, before, after)
	if after != before {
		t.Errorf("the waiter's queue write rewrote the beat")
	}
	// The holder's next renewal: does it still learn of the release?
	w.clk.Step(time.Second)
	err = h.Renew(ctx)
	t.Logf("holder's renewal after: %v", err)
	if !errors.Is(err, ErrLost) {
		t.Errorf("holder not told of the person's release: %v", err)
	}
}

// TestHolderWritesAfterOwnCarry: after helm's write carried the lock onto a
// new newest record, the holder's renewal writes the beat (a list, which
// returns the records and the beat, and the write) and its release the
// gate (the same list, the record read and written: the fake client cannot
// patch), with no conflict and no read again.
func TestHolderWritesAfterOwnCarry(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w.carry(t, h, 2)
	w.clk.Step(time.Second)
	n := len(w.cs.Actions())
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(w.cs.Actions()) - n; got != 2 {
		t.Errorf("the renewal after our own create made %d requests, want 2", got)
	}
	n = len(w.cs.Actions())
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(w.cs.Actions()) - n; got != 3 {
		t.Errorf("the release made %d requests, want 3", got)
	}
}

// TestReleaseAfterAnUnsureWriteFindsTheNewest (reviews of the release
// where the lock was last written): the fence noted the holder's write of
// revision 2 (GateWritten, inside its Carry); then a create of revision 3
// under the lock committed, and the lock was not told where it went: its
// answer was lost (the fence says GateUnsure), or the Carry's write did
// not call GateWritten (a caller telling the lock only after Carry
// returned would leave a gap where a release, from a signal path say,
// finds the last copy on revision 2, unchanged). The release must not
// patch revision 2 and leave revision 3, the newest, with the holder's
// unreleased lock: it reads where the lock is, releases it there, and
// another session takes the release at once. Told of every write, it
// releases where the last one went.
func TestReleaseAfterAnUnsureWriteFindsTheNewest(t *testing.T) {
	for _, c := range []struct {
		name   string
		create func(t *testing.T, w *rworld, h *part) // the write of revision 3, if any
		newest int
	}{
		{"every write told", nil, 2},
		{"answer lost", func(t *testing.T, w *rworld, h *part) { w.carry(t, h, 3); h.GateUnsure() }, 3},
		{"carry not told", func(t *testing.T, w *rworld, h *part) { w.carry(t, h, 3) }, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRWorld(t)
			ctx := context.Background()
			h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			err = h.Carry(func(rec Record) error {
				rec.Revision = 2
				enc, _ := rec.Encode()
				out, err := w.cs.CoreV1().Secrets(ns).Create(ctx, recSecret(2, "pending-upgrade", map[string]string{AnnotationRecord: enc}), metav1.CreateOptions{})
				if err == nil {
					h.GateWritten(out.ObjectMeta)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if c.create != nil {
				c.create(t, w, h)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			newest := "sh.helm.release.v1.web.v" + strconv.Itoa(c.newest)
			s, err := w.cs.CoreV1().Secrets(ns).Get(ctx, newest, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rec, err := DecodeRecord(s.Annotations[AnnotationRecord]); err != nil || rec.Session != h.Session() || rec.ReleasedAt.IsZero() {
				t.Errorf("the newest record %s carries %+v (%v), want the holder's lock released", newest, rec, err)
			}
			r2 := req(OpUpgrade, 15*time.Second)
			r2.Session = "other-session"
			if _, _, err := w.b.TryAcquire(ctx, r2); err != nil {
				t.Errorf("another session right after the holder's release: %v; want the lock free", err)
			}
		})
	}
}
