package releasestore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// The release store keeps a release's lock in two objects. The gate is the
// lock record on the release's newest storage record (AnnotationRecord): it
// is written when the lock is taken and released, and helm's own writes
// carry it (the pending revision is created with it, one atomic write). The
// beat is a small object of the driver's kind (a Secret or ConfigMap named
// LeaseName(release), no payload) that holds what changes while the lock is
// held or waited for: the holder's renewals (its heartbeat, AnnotationBeat)
// and the waiters' queue (AnnotationWaiters). Waiting and renewing thus never
// rewrite a record that carries helm's release data, which can be near 1 MiB.
//
// The rules that keep the two objects one lock:
//
//   - A client takes the lock by first claiming the beat (its heartbeat
//     naming it, and AnnotationClaimedFrom naming the gate's session it
//     judged), conditional on the beat's resourceVersion it judged by, and
//     then writing the gate, conditional on the gate's. The claim is what
//     stops the previous holder: its next renewal conflicts, reads the beat
//     again, finds it is not its own, and stops (ErrLost). A renewal in
//     flight and a claim cannot both commit.
//   - A beat is overwritten only by the session it names (a renewal), or by
//     a claim made after judging the lock Free or Expired from that very
//     beat (the holder it names has passed its renew deadline), or after the
//     beat's own LOCKED TILL passed when it names someone the gate does not
//     (a claimant that died before it wrote the gate).
//   - A fresh beat naming a session the gate does not name, claimed from the
//     session the gate names (or from none, when the newest record carries
//     no lock), is a claim in flight: everybody else judges the lock Live
//     until it lands or expires. A holder's renewals claim from itself, so
//     the beat it leaves behind is never taken for a claim against a later
//     gate (a stock helm revision that carries none, say).
//   - The lock's LOCKED TILL is the later of the gate's own (taken at the
//     take, renewedAt + leaseDuration) and the beat's, when the beat names the
//     gate's holder and is not released.
//   - A person's forced release (unlock) marks the beat released before the
//     gate, so a holder that is still alive stops at its next renewal.
const (
	// AnnotationBeat holds, on the beat object, the record of the session
	// that last claimed or renewed the lock (a trimmed Record).
	AnnotationBeat = "helm-autorecover.io/beat"
	// AnnotationClaimedFrom names, on the beat object, the gate's session
	// its claimant judged Free or Expired ("" when the gate had none).
	AnnotationClaimedFrom = "helm-autorecover.io/claimed-from"
	// AnnotationClaimedOn names, on the beat object, the release record a
	// claim was made against and its resourceVersion ("NAME@RV"): the gate
	// the claimant writes next, conditional on that version. A claim counts
	// against that gate only: once the record changed (the claimant's gate
	// landed, or a write beat it) or a newer record became the newest, the
	// claim is either the holder's own beat or dead. So a holder's beat that
	// was never renewed after its take is not taken for a claim in flight
	// against a later record (stock helm's, carrying no lock). Renewals and
	// beats of earlier versions carry none: a claim without it counts
	// against any gate naming the session it claims from.
	AnnotationClaimedOn = "helm-autorecover.io/claimed-on"
	// AnnotationWaiters holds, on the beat object, the waiters' queue in a
	// compact form (see compactWaiter).
	AnnotationWaiters = "helm-autorecover.io/waiters"
	// beatSecretType is the type of a beat Secret.
	beatSecretType corev1.SecretType = "helm-autorecover.io/beat"
	// gateHoldWithoutMaxHold is how long a client of a version that does
	// not know the beat takes a gate written without a maximum hold time
	// to be live (see gateForm).
	gateHoldWithoutMaxHold = 24 * time.Hour
)

// gateForm is rec as it is written on a release record. Liveness names the
// beat object where renewals go; LockedTill is a bound for clients of
// earlier versions, which judge the gate alone and know nothing of the
// beat: the holder stops writing by its maximum hold time plus a lease (it
// stops renewing then), or, without one, gateHoldWithoutMaxHold after it took the
// lock. Clients that read Liveness judge the gate by renewedAt +
// leaseDuration and the beat (see gateEffective).
func gateForm(rec lock.Record) lock.Record {
	rec.Liveness = lock.LeaseName(rec.Release)
	if rec.ReleasedAt.IsZero() {
		if !rec.MaxHoldUntil.IsZero() {
			rec.LockedTill = later(rec.MaxHoldUntil, rec.RenewedAt).Add(rec.LeaseDuration.Duration)
		} else {
			rec.LockedTill = rec.RenewedAt.Add(gateHoldWithoutMaxHold)
		}
	}
	return rec
}

// GateRecord is rec in the form written on a release record (the fence's
// copies of the lock onto helm's writes use it): see gateForm.
func GateRecord(rec lock.Record) lock.Record { return gateForm(rec) }

// gateEffective undoes gateForm for a reader that knows the beat: a gate
// naming a beat expires one lease after its own renewedAt, unless the beat
// says later.
func gateEffective(rec *lock.Record) {
	if rec == nil || rec.Liveness == "" {
		return
	}
	rec.LockedTill = rec.RenewedAt.Add(rec.LeaseDuration.Duration)
}

// beat is what the beat object keeps of the record of the session that
// claimed or renews the lock: who, for what, and until when, in short keys
// and Unix milliseconds (the record's times are whole milliseconds), so a
// renewal writes a few hundred bytes.
type beat struct {
	Session    string         `json:"s"`
	Operation  lock.Operation `json:"o,omitempty"`
	Who        string         `json:"w,omitempty"`
	Revision   int            `json:"r,omitempty"`
	Lease      int64          `json:"d"`
	Acquired   int64          `json:"a"`
	Renewed    int64          `json:"t"`
	After      int64          `json:"f,omitempty"`
	Till       int64          `json:"x"`
	Released   int64          `json:"rel,omitempty"`
	ReleasedBy string         `json:"by,omitempty"`
}

// EncodeBeat is the beat of rec, as stored in AnnotationBeat.
func EncodeBeat(rec lock.Record) (string, error) {
	b := beat{
		Session: rec.Session, Operation: rec.Operation, Who: rec.Who, Revision: rec.Revision,
		Lease: rec.LeaseDuration.Milliseconds(), Acquired: rec.AcquiredAt.UnixMilli(),
		Renewed: rec.RenewedAt.UnixMilli(), Till: rec.LockedTill.UnixMilli(), ReleasedBy: rec.ReleasedBy,
	}
	if !rec.ReleasedAt.IsZero() {
		b.Released = rec.ReleasedAt.UnixMilli()
	}
	if !rec.RenewedAfter.IsZero() {
		b.After = rec.RenewedAfter.UnixMilli()
	}
	out, err := json.Marshal(b)
	if err != nil {
		return "", fmt.Errorf("encode the lock's beat of release %q in namespace %q: %w", rec.Release, rec.Namespace, err)
	}
	return string(out), nil
}

// decodeBeat reads a beat back as the record it keeps of release in ns
// (nil when unreadable).
func decodeBeat(s, release, ns string) *lock.Record {
	var b beat
	if err := json.Unmarshal([]byte(s), &b); err != nil || b.Session == "" {
		return nil
	}
	ms := func(v int64) time.Time { return time.UnixMilli(v).UTC() }
	rec := &lock.Record{
		Schema: lock.SchemaVersion, Session: b.Session, Operation: b.Operation, Release: release, Namespace: ns,
		Revision: b.Revision, Who: b.Who, LeaseDuration: metav1.Duration{Duration: time.Duration(b.Lease) * time.Millisecond},
		AcquiredAt: ms(b.Acquired), RenewedAt: ms(b.Renewed), LockedTill: ms(b.Till), ReleasedBy: b.ReleasedBy,
	}
	if b.Released != 0 {
		rec.ReleasedAt = ms(b.Released)
	}
	if b.After != 0 {
		rec.RenewedAfter = ms(b.After)
	}
	return rec
}

// compactWaiter is a Waiter as the beat object stores it: short keys and
// Unix milliseconds, and the waiter's lease instead of its heartbeat time
// (HeartbeatAt = expiry - lease), so a queue of ten stays near a kilobyte.
// Entries written by versions before the lease was kept have none: they
// are judged by server time alone (see waiterStopped).
type compactWaiter struct {
	Session    string         `json:"s"`
	Who        string         `json:"w,omitempty"`
	Operation  lock.Operation `json:"o,omitempty"`
	EnqueuedAt int64          `json:"e"`
	Expires    int64          `json:"x"`
	Lease      int64          `json:"l,omitempty"`
	Preempt    bool           `json:"p,omitempty"`
	Holder     string         `json:"ph,omitempty"`
}

func EncodeWaiters(ws []lock.Waiter) (string, error) {
	out := make([]compactWaiter, 0, len(ws))
	for _, w := range ws {
		c := compactWaiter{
			Session: w.Session, Who: w.Who, Operation: w.Operation,
			EnqueuedAt: w.EnqueuedAt.UnixMilli(), Expires: w.ExpiresAt.UnixMilli(),
			Preempt: w.Preempt, Holder: w.PreemptHolder,
		}
		if !w.HeartbeatAt.IsZero() && w.ExpiresAt.After(w.HeartbeatAt) {
			c.Lease = w.ExpiresAt.Sub(w.HeartbeatAt).Milliseconds()
		}
		out = append(out, c)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("encode lock queue: %w", err)
	}
	return string(b), nil
}

// DecodeWaiters reads a compact queue; an unreadable one is empty (see
// DecodeQueue).
func DecodeWaiters(s string) []lock.Waiter {
	if s == "" {
		return nil
	}
	var in []compactWaiter
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil
	}
	out := make([]lock.Waiter, 0, len(in))
	for _, w := range in {
		x := lock.Waiter{
			Session: w.Session, Who: w.Who, Operation: w.Operation,
			EnqueuedAt: time.UnixMilli(w.EnqueuedAt).UTC(),
			ExpiresAt:  time.UnixMilli(w.Expires).UTC(),
			Preempt:    w.Preempt,
			// The holder asked to stop (PreemptHolder).
			PreemptHolder: w.Holder,
		}
		if w.Lease > 0 {
			x.HeartbeatAt = x.ExpiresAt.Add(-time.Duration(w.Lease) * time.Millisecond)
		}
		out = append(out, x)
	}
	return out
}

// beats reads and writes beat objects: Secrets or ConfigMaps as the driver
// keeps its records, metadata only.
type beats struct {
	client kubernetes.Interface
	kind   string
	// unlisted is set once a create of a beat found one already there
	// that the release's list did not show (its name label removed):
	// from then on the beat is read by name (releaseStore.read), and the
	// next write of ours labels it again.
	unlisted *atomic.Bool
}

// beatObj is a beat object's metadata; exists is false when there is none.
type beatObj struct {
	meta   metav1.ObjectMeta
	exists bool
}

// isUnlisted reports whether the beat is to be read by name (unlisted).
func (b beats) isUnlisted() bool { return b.unlisted != nil && b.unlisted.Load() }

func (o beatObj) rv() string {
	if !o.exists {
		return ""
	}
	return o.meta.ResourceVersion
}

func (b beats) get(ctx context.Context, ns, name string) (beatObj, error) {
	var meta metav1.ObjectMeta
	var err error
	if b.kind == records.KindConfigMap {
		var c *corev1.ConfigMap
		if c, err = b.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			meta = c.ObjectMeta
		}
	} else {
		var s *corev1.Secret
		if s, err = b.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			meta = s.ObjectMeta
		}
	}
	switch {
	case apierrors.IsNotFound(err):
		return beatObj{}, nil
	case err != nil:
		return beatObj{}, err
	}
	return beatObj{meta: meta, exists: true}, nil
}

// list returns the beat objects in ns ("" for all namespaces).
func (b beats) list(ctx context.Context, ns string) ([]beatObj, error) {
	opts := metav1.ListOptions{LabelSelector: lock.LabelManagedBy + "=" + lock.ManagedBy}
	var out []beatObj
	if b.kind == records.KindConfigMap {
		l, err := b.client.CoreV1().ConfigMaps(ns).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			out = append(out, beatObj{meta: l.Items[i].ObjectMeta, exists: true})
		}
		return out, nil
	}
	l, err := b.client.CoreV1().Secrets(ns).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		if l.Items[i].Type == beatSecretType {
			out = append(out, beatObj{meta: l.Items[i].ObjectMeta, exists: true})
		}
	}
	return out, nil
}

// put writes o's metadata: a Create when cur does not exist (AlreadyExists
// becomes Conflict: someone else wrote it first), else an Update
// conditional on cur's resourceVersion. Managed fields are left to the
// server, so the request carries only what the beat says.
func (b beats) put(ctx context.Context, cur beatObj, meta metav1.ObjectMeta) (beatObj, error) {
	// One empty entry strips the managed fields from the object stored
	// (documented for server-side apply): nobody applies beats, and they
	// would be a third of every write.
	meta.ManagedFields = []metav1.ManagedFieldsEntry{{}}
	meta.ResourceVersion = cur.rv()
	opts := metav1.UpdateOptions{FieldManager: FieldManager}
	var out metav1.ObjectMeta
	var err error
	if b.kind == records.KindConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: meta}
		var r *corev1.ConfigMap
		if cur.exists {
			r, err = b.client.CoreV1().ConfigMaps(meta.Namespace).Update(ctx, c, opts)
		} else {
			r, err = b.client.CoreV1().ConfigMaps(meta.Namespace).Create(ctx, c, metav1.CreateOptions{FieldManager: FieldManager})
		}
		if err == nil {
			out = r.ObjectMeta
		}
	} else {
		s := &corev1.Secret{ObjectMeta: meta, Type: beatSecretType}
		var r *corev1.Secret
		if cur.exists {
			r, err = b.client.CoreV1().Secrets(meta.Namespace).Update(ctx, s, opts)
		} else {
			r, err = b.client.CoreV1().Secrets(meta.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: FieldManager})
		}
		if err == nil {
			out = r.ObjectMeta
		}
	}
	if apierrors.IsAlreadyExists(err) {
		if b.unlisted != nil {
			b.unlisted.Store(true)
		}
		return beatObj{}, apierrors.NewConflict(leaseResource, meta.Name, err)
	}
	if err != nil {
		return beatObj{}, err
	}
	return beatObj{meta: out, exists: true}, nil
}

// remove deletes cur, conditional on its UID and resourceVersion; a beat
// already gone is fine.
func (b beats) remove(ctx context.Context, cur beatObj) error {
	if !cur.exists {
		return nil
	}
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.meta.UID, ResourceVersion: &cur.meta.ResourceVersion}}
	var err error
	if b.kind == records.KindConfigMap {
		err = b.client.CoreV1().ConfigMaps(cur.meta.Namespace).Delete(ctx, cur.meta.Name, opts)
	} else {
		err = b.client.CoreV1().Secrets(cur.meta.Namespace).Delete(ctx, cur.meta.Name, opts)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (b beats) watch(ctx context.Context, ns, name, rv string) (watch.Interface, error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv}
	if b.kind == records.KindConfigMap {
		return b.client.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
	}
	return b.client.CoreV1().Secrets(ns).Watch(ctx, opts)
}

// beatRecord decodes the beat on o (nil when none or unreadable).
func beatRecord(o beatObj) *lock.Record {
	if !o.exists {
		return nil
	}
	s, ok := o.meta.Annotations[AnnotationBeat]
	if !ok {
		return nil
	}
	return decodeBeat(s, o.meta.Labels[lock.LabelRelease], o.meta.Namespace)
}

// mergedWatch delivers the events of several watches on one channel, which
// is closed once any of them ends (the caller then decides again and
// watches anew) or Stop is called.
type mergedWatch struct {
	parts []watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func mergeWatches(parts ...watch.Interface) watch.Interface {
	m := &mergedWatch{parts: parts, out: make(chan watch.Event), stop: make(chan struct{})}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case ev, ok := <-p.ResultChan():
					if !ok {
						m.Stop()
						return
					}
					select {
					case m.out <- ev:
					case <-m.stop:
						return
					}
				case <-m.stop:
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(m.out)
	}()
	return m
}

func (m *mergedWatch) ResultChan() <-chan watch.Event { return m.out }

// Stop ends every part.
func (m *mergedWatch) Stop() {
	m.once.Do(func() {
		close(m.stop)
		for _, p := range m.parts {
			p.Stop()
		}
	})
}

// GateEffective undoes GateRecord for a reader that knows the beat
// (gateEffective).
func GateEffective(rec *lock.Record) { gateEffective(rec) }

// DecodeBeat reads a beat object's AnnotationBeat back as the record it
// keeps of release in ns (nil when unreadable): for tools that audit the
// lock's writes (internal/sim).
func DecodeBeat(s, release, ns string) *lock.Record { return decodeBeat(s, release, ns) }
