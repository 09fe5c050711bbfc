package lock

import (
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestQuiet is the table of the changes a waiter lets pass without reading
// the lock again (watchView.quiet): the only wrong answer is "quiet" for a
// change after which it could take the lock, or must queue again, or must
// adopt its own take.
func TestQuiet(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	now := servertime.Bounds{Earliest: t0, Latest: t0.Add(time.Second)}
	lease := 15 * time.Second
	const self, ahead, holder, other = "self", "ahead", "holder", "other"

	rec := func(session string, renewed time.Time, released bool) string {
		r := Record{
			Schema: SchemaVersion, Session: session, Operation: OpUpgrade, Release: "web", Namespace: "shop",
			LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0.Add(-time.Minute), RenewedAt: renewed,
			LockedTill: renewed.Add(lease), MaxHoldUntil: t0.Add(time.Hour),
		}
		if released {
			r.ReleasedAt = renewed
		}
		s, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	waiter := func(session string, expires time.Time) Waiter {
		return Waiter{Session: session, EnqueuedAt: t0.Add(-time.Minute), ExpiresAt: expires}
	}
	liveTill := t0.Add(lease)
	dead := t0.Add(-lease)

	// The Lease store: the event carries the Lease.
	lease4 := func(holderID, record string, ws ...Waiter) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{}}}
		l.Spec.HolderIdentity = &holderID
		if record != "" {
			l.Annotations[AnnotationRecord] = record
		}
		if len(ws) > 0 {
			q, err := EncodeQueue(ws)
			if err != nil {
				t.Fatal(err)
			}
			l.Annotations[AnnotationQueue] = q
		}
		return l
	}
	held := rec(holder, t0.Add(-5*time.Second), false)
	renewed := rec(holder, t0, false)
	released := rec(holder, t0, true)

	// The release store: the beat object and the records.
	beatEvent := func(session string, released bool, ws ...Waiter) *corev1.Secret {
		r := Record{Session: session, Operation: OpUpgrade, Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0, LockedTill: liveTill}
		if released {
			r.ReleasedAt = t0
		}
		b, err := encodeBeat(r)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{Stores.AnnotationBeat: b, Stores.AnnotationClaimedFrom: session}}}
		if len(ws) > 0 {
			q, err := encodeWaiters(ws)
			if err != nil {
				t.Fatal(err)
			}
			s.Annotations[Stores.AnnotationWaiters] = q
		}
		return s
	}
	record := func(rev int, lockRecord string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Name: "sh.helm.release.v1.web.v" + itoa(rev), Namespace: "shop",
			Labels: map[string]string{records.LabelVersion: itoa(rev), "name": "web", "owner": "helm"},
		}}
		if lockRecord != "" {
			s.Annotations = map[string]string{AnnotationRecord: lockRecord}
		}
		return s
	}
	virtual := func(gateRev int, gateRecord string, beatHolder string, ws ...Waiter) *Snapshot {
		g := record(gateRev, gateRecord)
		gr := records.Record{Kind: records.KindSecret, Meta: g.ObjectMeta}
		b := beatEvent(beatHolder, false, ws...)
		return Stores.ReleaseSnapshot("", "web", gr, &b.ObjectMeta, "100")
	}

	cases := []struct {
		name  string
		store Store
		seen  *Snapshot
		typ   watch.EventType
		obj   runtime.Object
		quiet bool
	}{
		// Lease store.
		{
			"lease: behind a live waiter, the holder releases", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(ahead, liveTill), waiter(self, liveTill))), watch.Modified,
			lease4("", released, waiter(ahead, liveTill), waiter(self, liveTill)), true,
		},
		{
			"lease: behind a dead waiter, the holder releases", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(ahead, dead), waiter(self, liveTill))), watch.Modified,
			lease4("", released, waiter(ahead, dead), waiter(self, liveTill)), false,
		},
		{
			"lease: first, the holder renews", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(self, liveTill))), watch.Modified,
			lease4(holder, renewed, waiter(self, liveTill), waiter(other, liveTill)), true,
		},
		{
			"lease: first, the holder releases", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(self, liveTill))), watch.Modified,
			lease4("", released, waiter(self, liveTill)), false,
		},
		{
			"lease: first, another session holds it", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(self, liveTill))), watch.Modified,
			lease4(other, rec(other, t0, false), waiter(self, liveTill)), false,
		},
		{
			"lease: first after the waiter ahead left", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(ahead, liveTill), waiter(self, liveTill))), watch.Modified,
			lease4(holder, renewed, waiter(self, liveTill)), true,
		},
		{
			"lease: dropped from the queue", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(self, liveTill))), watch.Modified,
			lease4(holder, renewed, waiter(other, liveTill)), false,
		},
		{
			"lease: our own take committed late", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(ahead, liveTill), waiter(self, liveTill))), watch.Modified,
			lease4(self, rec(self, t0, false), waiter(ahead, liveTill)), false,
		},
		{
			"lease: deleted", leaseChanges(),
			leaseSnapshot(lease4(holder, held, waiter(self, liveTill))), watch.Deleted,
			lease4(holder, held, waiter(self, liveTill)), false,
		},

		// Release store: the beat.
		{
			"release: beat, behind a live waiter, a claim", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(ahead, liveTill), waiter(self, liveTill)), watch.Modified,
			beatEvent(other, false, waiter(ahead, liveTill), waiter(self, liveTill)), true,
		},
		{
			"release: beat, first, the holder renews", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			beatEvent(holder, false, waiter(self, liveTill), waiter(other, liveTill)), true,
		},
		{
			"release: beat, first, the holder's beat released", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			beatEvent(holder, true, waiter(self, liveTill)), false,
		},
		{
			"release: beat, first, another session claims", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			beatEvent(other, false, waiter(self, liveTill)), false,
		},
		{
			"release: beat, our own claim", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(ahead, liveTill), waiter(self, liveTill)), watch.Modified,
			beatEvent(self, false, waiter(ahead, liveTill)), false,
		},
		{
			"release: beat deleted", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Deleted,
			beatEvent(holder, false, waiter(self, liveTill)), false,
		},

		// Release store: the records, first in the queue.
		{
			"release: an older record superseded", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			record(2, ""), true,
		},
		{
			"release: an older record pruned", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Deleted,
			record(1, ""), true,
		},
		{
			"release: the holder's pending revision", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Added,
			record(4, rec(holder, t0, false)), true,
		},
		{
			"release: the gate rewritten by its holder", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			record(3, rec(holder, t0.Add(time.Second), false)), true,
		},
		{
			"release: the gate released", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			record(3, rec(holder, t0, true)), false,
		},
		{
			"release: the gate taken by another session", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			record(3, rec(other, t0, false)), false,
		},
		{
			"release: the gate deleted", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Deleted,
			record(3, rec(holder, t0, false)), false,
		},
		{
			"release: a newer record without a lock (stock helm)", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Added,
			record(4, ""), false,
		},
		{
			"release: a newer record of another session", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Added,
			record(4, rec(other, t0, false)), false,
		},
		{
			"release: behind a live waiter, the gate released", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(ahead, liveTill), waiter(self, liveTill)), watch.Modified,
			record(3, rec(holder, t0, true)), true,
		},
		{
			"release: behind a dead waiter, the gate released", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(ahead, dead), waiter(self, liveTill)), watch.Modified,
			record(3, rec(holder, t0, true)), false,
		},
		{
			"release: our own gate", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(ahead, liveTill), waiter(self, liveTill)), watch.Modified,
			record(3, rec(self, t0, false)), false,
		},
		{
			"release: another release's record", releaseChanges(),
			virtual(3, rec(holder, t0, false), holder, waiter(self, liveTill)), watch.Modified,
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "elsewhere"}}, false,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newWatchView(c.seen, self, true)
			if got := v.quiet(c.store, watch.Event{Type: c.typ, Object: c.obj}, now, 250*time.Millisecond); got != c.quiet {
				t.Errorf("quiet = %v, want %v", got, c.quiet)
			}
		})
	}
}

// TestQuietFollowsTheQueue: a waiter that learned from a beat change that
// it is now first no longer lets the gate's release pass.
func TestQuietFollowsTheQueue(t *testing.T) {
	f := newReleaseLock(t, t0q, "ahead", "self")
	v := newWatchView(f.seen, "self", true)
	ev := f.gateEvent(true)
	if !v.quiet(releaseChanges(), ev, f.now, 0) {
		t.Fatal("behind a live waiter, the gate's release was not quiet")
	}
	if !v.quiet(releaseChanges(), f.beatEvent("self"), f.now, 0) {
		t.Fatal("the holder's renewal with the queue shortened was not quiet")
	}
	if v.quiet(releaseChanges(), ev, f.now, 0) {
		t.Fatal("first in the queue now, the gate's release was quiet")
	}
}

// t0q is the server time of the release lock fixtures.
var t0q = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// releaseLock is a release store's lock as a waiter last read it: the gate
// on revision 3 of release web, held by session "holder" renewed at a given
// time with a 15 s lease, and its beat with a queue.
type releaseLock struct {
	t    *testing.T
	now  servertime.Bounds
	rec  Record
	gate metav1.ObjectMeta
	beat metav1.ObjectMeta
	seen *Snapshot
}

func newReleaseLock(t *testing.T, renewed time.Time, queue ...string) *releaseLock {
	t.Helper()
	lease := 15 * time.Second
	f := &releaseLock{t: t, now: servertime.Bounds{Earliest: t0q, Latest: t0q.Add(50 * time.Millisecond)}}
	f.rec = Record{
		Schema: SchemaVersion, Session: "holder", Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease},
		AcquiredAt: renewed, RenewedAt: renewed, LockedTill: renewed.Add(lease),
	}
	b, err := encodeBeat(f.rec)
	if err != nil {
		t.Fatal(err)
	}
	f.gate = metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", Labels: map[string]string{records.LabelVersion: "3"}, Annotations: map[string]string{AnnotationRecord: f.gateRecord(false)}}
	f.beat = metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{Stores.AnnotationBeat: b, Stores.AnnotationClaimedFrom: "holder", Stores.AnnotationWaiters: f.waiters(queue...)}}
	f.seen = Stores.ReleaseSnapshot("", "web", records.Record{Kind: records.KindSecret, Meta: f.gate}, &f.beat, "100")
	return f
}

// gateRecord is the gate's record as stored, released or not.
func (f *releaseLock) gateRecord(released bool) string {
	r := f.rec
	if released {
		r.ReleasedAt = t0q
	}
	g := gateForm(r)
	s, err := g.Encode()
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// waiters is a beat's queue of sessions, each live for a lease.
func (f *releaseLock) waiters(sessions ...string) string {
	var ws []Waiter
	for _, s := range sessions {
		ws = append(ws, Waiter{Session: s, ExpiresAt: t0q.Add(15 * time.Second)})
	}
	q, err := encodeWaiters(ws)
	if err != nil {
		f.t.Fatal(err)
	}
	return q
}

// gateEvent is a change of the gate: its holder's record, released or not.
func (f *releaseLock) gateEvent(released bool) watch.Event {
	g := f.gate.DeepCopy()
	g.Annotations[AnnotationRecord] = f.gateRecord(released)
	return watch.Event{Type: watch.Modified, Object: &corev1.Secret{ObjectMeta: *g}}
}

// beatEvent is a change of the beat: the holder's, with the queue given.
func (f *releaseLock) beatEvent(queue ...string) watch.Event {
	b := f.beat.DeepCopy()
	b.Annotations[Stores.AnnotationWaiters] = f.waiters(queue...)
	return watch.Event{Type: watch.Modified, Object: &corev1.Secret{ObjectMeta: *b}}
}

func itoa(n int) string { return strconv.Itoa(n) }
