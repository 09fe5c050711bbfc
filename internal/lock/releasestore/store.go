package releasestore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Helm's storage labels, the same on Secrets and ConfigMaps (package helmx
// owns the full codec, package records the revision number; the lock needs
// only these to find a release's records).
const (
	recordLabelOwner = "owner"
	recordLabelName  = "name"
	// recordLabelStatus is helm's status label on every stored record.
	recordLabelStatus = "status"
	recordOwnerHelm   = "helm"
)

// FieldManager names the lock's writes to release records in managedFields.
// Readers that date a revision by its last write (helmx.Summarize) skip it:
// taking or renewing a lock is not a change of the release.
const FieldManager = "helm-autorecover-lock"

// annotationUnlabelled marks, on the newest record as read (in memory,
// never stored), a release with a record that carries no status label (see
// read).
const annotationUnlabelled = "helm-autorecover.io/unlabelled-records"

// NewBackend returns a backend that keeps each release's lock in the
// annotation AnnotationRecord (and its waiters in AnnotationQueue) of the
// release's newest stored revision, a Secret or ConfigMap as driver says.
//
// The newest record is the lock: whoever holds it may write the release. A
// takeover, a renewal and a release are updates of that record conditional
// on its resourceVersion. When the holder's helm writes the next revision,
// that record is created with the lock already in it (the guard's transport
// adds it to helm's own create, so the two are one atomic write), and the
// lock moves with it. A release with no stored revision has no record: the
// lock is then virtual (nothing is written) and the first revision's create,
// which fails for all but one writer, decides who holds it.
//
// Stock helm takes no lock. It rebuilds a record when it rewrites it
// (annotations vanish) and never copies annotations to the next revision, so
// a stale lock is never carried forward; but a stock rollback or uninstall
// running while a client holds the lock drops that live lock too. The holder
// finds out at its next renewal and stops (ErrLost), whether its record
// vanished from the newest record, a newer record without it appeared, or
// the newest record was deleted and an older one shows an older copy of its
// record (see part.reread); it never writes its lock back.
func NewBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, driver records.Driver) *lock.Backend {
	store := records.New(client, driver)
	bt := beats{client: client, kind: store.Kind(), unlisted: &atomic.Bool{}}
	seen := &lastReads{}
	noPatch := &atomic.Bool{}
	return lock.NewBackend(client, est, clk, lock.StoreRelease, func(ns string) lock.Store {
		return &releaseStore{records: store, beats: bt, ns: ns, seen: seen, noPatch: noPatch}
	})
}

// lastReads keeps, per lock, what a Read that found no record read (the
// list's resourceVersion, where a watch starts), for the Create that
// follows it: nothing is written to take a release that has no record, so
// reading again would decide nothing (the create of its first revision
// decides, through the write fence). Each entry serves one Create at most.
type lastReads struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *lastReads) put(key, listRV string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]string{}
	}
	c.m[key] = listRV
}

// take returns and forgets the entry of key.
func (c *lastReads) take(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	listRV, ok := c.m[key]
	delete(c.m, key)
	return listRV, ok
}

// releaseStore keeps each release's lock on its records: the gate on the
// newest record and the beat object (see beat.go), read together into
// one Snapshot whose version names each object's resourceVersion. A write
// conditional on a snapshot fails with Conflict when either changed.
type releaseStore struct {
	records records.Store
	beats   beats
	ns      string
	seen    *lastReads
	// noPatch is set, for the backend's life, once the API server refused
	// to patch a record (no patch right): gates are then read and updated.
	noPatch *atomic.Bool
}

// releaseVersion is what a release lock's snapshot was read at: the gate's
// (the newest record's) resourceVersion, the beat's, and the list's, from
// which a watch starts (the gate's own can be as old as the take, older
// than the API server's watch window); and the record and the beat as
// read, which a take writes from (Take).
type releaseVersion struct {
	gate, beat, list string
	record           records.Record
	beatObj          beatObj
}

func (s *releaseStore) version(from *lock.Snapshot) releaseVersion {
	v, _ := from.Version.(releaseVersion)
	return v
}

// withBeatVersion is snap with its beat now at resourceVersion beatRV (a
// virtual lock whose holder wrote its beat: see part.Carry).
func withBeatVersion(snap *lock.Snapshot, beatRV string) *lock.Snapshot {
	out := *snap
	v, _ := out.Version.(releaseVersion)
	v.beat, v.beatObj = beatRV, beatObj{}
	out.Version = v
	return &out
}

func historySelector(release string) string {
	return recordLabelOwner + "=" + recordOwnerHelm + "," + recordLabelName + "=" + release
}

func releaseOf(leaseName string) string { return strings.TrimPrefix(leaseName, lock.LeasePrefix) }

// read returns the metadata of the release's newest record (false when it
// has none), the list's resourceVersion, and the beat object.
//
// One metadata list of the objects labelled with the release's name
// returns both, from one snapshot: helm's records (also labelled
// owner=helm) and the beat (labelled with the name, see beatLabels); other
// objects a user labelled so are ignored. A beat the list does not show
// does not exist: nothing more is read for it. After a floored list
// (records.Floored), which asks for the records alone and may be served
// older than a read by name, the beat is read by name; so it is once a
// create of the beat found one the list did not show (its label removed
// by hand: beats.unlisted), until a write of ours labels it again. The
// gate is then read first: a claim lands on the beat before its gate, so a
// gate read first is never newer than the beat read after it.
func (s *releaseStore) read(ctx context.Context, release string) (records.Record, bool, string, beatObj, error) {
	selector, floored := recordLabelName+"="+release, records.Floored(ctx)
	if floored {
		selector = historySelector(release)
	}
	items, listRV, err := s.records.ListMeta(ctx, s.ns, selector)
	if err != nil {
		return records.Record{}, false, "", beatObj{}, fmt.Errorf("reading the stored revisions of release %q in namespace %q: %w", release, s.ns, err)
	}
	rs := items[:0:0]
	var beat beatObj
	for _, it := range items {
		switch {
		case it.Meta.Labels[recordLabelOwner] == recordOwnerHelm:
			rs = append(rs, it)
		case !floored && it.Meta.Name == lock.LeaseName(release) && it.Meta.Labels[lock.LabelManagedBy] == lock.ManagedBy:
			beat = beatObj{meta: it.Meta, exists: true}
		}
	}
	gate, ok := records.NewestOf(rs)
	if ok && slices.ContainsFunc(rs, func(r records.Record) bool { return r.Meta.Labels[recordLabelStatus] == "" }) {
		// A record without helm's status label (written by another tool,
		// or corrupted): said in the snapshot (Newest.Unlabelled), so that
		// the history is read in full, and such records named, before a
		// decision is made from the newest record alone (see part.Newest).
		markUnlabelled(&gate, "true")
	}
	if !beat.exists && (floored || s.beats.isUnlisted()) {
		if beat, err = s.beats.get(ctx, s.ns, lock.LeaseName(release)); err != nil {
			return records.Record{}, false, "", beatObj{}, fmt.Errorf("reading the lock's beat %s of release %q in namespace %q: %w", lock.LeaseName(release), release, s.ns, err)
		}
	}
	return gate, ok, listRV, beat, nil
}

// markUnlabelled sets annotationUnlabelled to v on a copy of r's
// annotations (r's metadata came from a list or an answer shared with no
// one else, but its map may be).
func markUnlabelled(r *records.Record, v string) {
	r.Meta.Annotations = maps.Clone(r.Meta.Annotations)
	if r.Meta.Annotations == nil {
		r.Meta.Annotations = map[string]string{}
	}
	r.Meta.Annotations[annotationUnlabelled] = v
}

// beatLabels are the labels of release's beat: the Lease's, and helm's
// name label, so that one list of the release's objects returns its
// records and its beat (see read). It carries no owner=helm: helm never
// lists it.
func beatLabels(release string) map[string]string {
	l := lock.LockLabels(release)
	l[recordLabelName] = release
	return l
}

// snapshot is the lock of release, gate record r and beat object beat,
// as the engine reads it: the gate's record with the beat's renewal merged
// in when the beat names the gate's holder, the beat's queue, and, when the
// beat names someone else or was marked released, the beat as the Claim.
// listRV is where a watch starts.
//
// The gate's own LOCKED TILL (renewedAt + lease, gateEffective) is used
// only when the beat says the holder's state: it names the holder (its
// renewals), or it is a claim judged from the holder's beat (claimed-from
// names the holder, so the claimant saw it expire). A beat that is missing,
// unreadable, or a claim from a stale view says nothing of the holder: the
// gate is then judged by the bound it was written with (gateForm), however
// long, rather than taken from a holder that may be renewing a beat someone
// deleted; on the reader's own clock it is judged by its holder's lease
// (Silent, see confirm), since a live holder writes its beat back at its
// next renewal.
func (s *releaseStore) snapshot(release string, r records.Record, beat beatObj, listRV string) *lock.Snapshot {
	out := &lock.Snapshot{
		Namespace: r.Meta.Namespace,
		Name:      lock.LeaseName(release),
		Release:   release,
		Object:    strings.ToLower(r.Kind) + "/" + r.Meta.Name,
		Newest: &lock.Newest{
			Name:            r.Meta.Name,
			Revision:        r.Revision(),
			Status:          r.Meta.Labels[recordLabelStatus],
			ResourceVersion: r.Meta.ResourceVersion,
			Unlabelled:      r.Meta.Annotations[annotationUnlabelled] != "",
		},
		Queue:   DecodeWaiters(beat.meta.Annotations[AnnotationWaiters]),
		Version: releaseVersion{gate: r.Meta.ResourceVersion, beat: beat.rv(), list: listRV, record: r, beatObj: beat},
	}
	out.Raw, out.HasRecord = r.Meta.Annotations[lock.AnnotationRecord]
	out.Spec = lock.SpecOf(out.Raw)
	bt := beatRecord(beat)
	from := beat.meta.Annotations[AnnotationClaimedFrom]
	g, gErr := lock.DecodeRecord(out.Raw)
	newer := errors.Is(gErr, lock.ErrUnsupportedSchema)
	if out.HasRecord && g != nil && g.Session != "" && (gErr == nil || newer) {
		out.Newest.GateRenewed = g.RenewedAt
		own := bt != nil && bt.Session == g.Session
		switch {
		case own && bt.ReleasedAt.IsZero():
			gateEffective(g)
			// A released gate is the holder's last word: its beat's
			// renewals came before the release, and must not take back
			// what the release says (the revision it names, the holder
			// it names abandoned: the simulation, seed 84184, found a
			// preempted holder whose failed settle released naming
			// itself abandoned, undone here by its own earlier renewal,
			// and the release left stuck).
			if g.ReleasedAt.IsZero() && bt.RenewedAt.After(g.RenewedAt) {
				g.RenewedAt, g.RenewedAfter, g.Revision = bt.RenewedAt, bt.RenewedAfter, bt.Revision
				if bt.Revision > 0 {
					g.Abandoned = nil
				}
			}
			g.LockedTill = later(g.LockedTill, bt.LockedTill)
			bt = nil
		case !own && bt != nil && from == g.Session:
			gateEffective(g)
		case gErr == nil && g.Liveness != "" && g.ReleasedAt.IsZero():
			// The beat says nothing of the holder. A live holder cannot
			// renew without writing its own beat over it (its renewal is
			// conditional on the beat as it stands), which readers see:
			// one that does not renew for a lease has stopped.
			out.Silent = true
		}
		if !newer {
			if enc, err := g.Encode(); err == nil {
				out.Raw = enc
				out.Spec = lock.SpecOf(enc)
			}
		} else if h := lock.HolderOf(&out.Spec); h != "" && out.Spec.LeaseDurationSeconds != nil {
			// Judged by the spec alone (its schema is unknown): the spec
			// says LOCKED TILL as worked out above.
			secs := time.Duration(*out.Spec.LeaseDurationSeconds) * time.Second
			out.Spec.RenewTime = &metav1.MicroTime{Time: later(g.LockedTill, g.RenewedAt.Add(secs)).Add(-secs)}
		}
	}
	if out.HasRecord {
		out.Record, out.RecordErr = lock.DecodeRecord(out.Raw)
	}
	if bt != nil {
		if enc, err := bt.Encode(); err == nil {
			if c, err := lock.DecodeRecord(enc); err == nil {
				out.Claim = &lock.Claim{Record: c, Encoded: enc, From: from, On: beat.meta.Annotations[AnnotationClaimedOn]}
			}
		}
	}
	return out
}

// holding is from with rec as its record and queue as its waiters (when
// set): the lock as a write that stored nothing leaves it (a virtual lock,
// whose release has no record yet).
func holding(from *lock.Snapshot, rec *lock.Record, queue []lock.Waiter, setQueue bool) (*lock.Snapshot, error) {
	out := *from
	if rec != nil {
		enc, err := rec.Encode()
		if err != nil {
			return nil, err
		}
		out.Raw, out.HasRecord = enc, true
		out.Record, out.RecordErr = lock.DecodeRecord(enc)
		lock.ApplyHolder(&out.Spec, rec)
	}
	if setQueue {
		out.Queue = slices.Clone(queue)
	}
	return &out, nil
}

var leaseResource = coordinationv1.Resource("leases")

// Read reads the lock of the release name names: one metadata list of its
// objects (see read).
func (s *releaseStore) Read(ctx context.Context, name string) (*lock.Snapshot, error) {
	rel := releaseOf(name)
	r, ok, listRV, beat, err := s.read(ctx, rel)
	if err != nil {
		return nil, err
	}
	if !ok {
		if s.seen != nil {
			s.seen.put(s.ns+"/"+name, listRV)
		}
		return nil, apierrors.NewNotFound(leaseResource, name)
	}
	if s.seen != nil {
		// A record found since: a Create that follows reads again.
		s.seen.take(s.ns + "/" + name)
	}
	return s.snapshot(rel, r, beat, listRV), nil
}

// Create takes the lock of a release that has no stored revision: nothing is
// written (there is no record yet, and so no gate). The snapshot returned
// is virtual (no Newest), read at the list's resourceVersion, so a watch
// from it misses nothing.
func (s *releaseStore) Create(ctx context.Context, name string, rec lock.Record) (*lock.Snapshot, error) {
	listRV, hit := "", false
	if s.seen != nil {
		listRV, hit = s.seen.take(s.ns + "/" + name)
	}
	if !hit {
		_, ok, rv, _, err := s.read(ctx, releaseOf(name))
		if err != nil {
			return nil, err
		}
		if ok {
			return nil, apierrors.NewAlreadyExists(leaseResource, name)
		}
		listRV = rv
	}
	out := &lock.Snapshot{Namespace: s.ns, Name: name, Release: rec.Release, Version: releaseVersion{gate: listRV, list: listRV}}
	return holding(out, &rec, nil, false)
}

// Take claims the beat, then writes the gate (see write), from what from
// read: the claim is conditional on the beat as read, the gate write on the
// newest record as read, which is checked to be still the newest by a
// metadata list after the claim; reading it all again before the claim
// would only narrow a window the protocol already tolerates (a beat claimed
// from a view whose gate write then conflicts is a claim from a stale
// view).
func (s *releaseStore) Take(ctx context.Context, from *lock.Snapshot, rec lock.Record, queue []lock.Waiter) (*lock.Snapshot, error) {
	return s.write(ctx, from, lockWrite{want: &rec, queue: queue, setQueue: true, take: true})
}

// Renew writes the holder's renewal, or the revision it names, on the beat.
func (s *releaseStore) Renew(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return s.write(ctx, from, lockWrite{want: &rec, holder: true})
}

// Enqueue writes the waiters' queue on the beat.
func (s *releaseStore) Enqueue(ctx context.Context, from *lock.Snapshot, queue []lock.Waiter) (*lock.Snapshot, error) {
	return s.write(ctx, from, lockWrite{queue: queue, setQueue: true})
}

// Release writes the holder's own release on the gate: first where its
// write fence last left it (at), conditional on that resourceVersion,
// without reading (releaseWhereWritten); otherwise after reading.
func (s *releaseStore) Release(ctx context.Context, from *lock.Snapshot, rec lock.Record, at string) (*lock.Snapshot, error) {
	if out, ok, err := s.releaseWhereWritten(ctx, from, rec, at); ok || err != nil {
		return out, err
	}
	return s.write(ctx, from, lockWrite{want: &rec, holder: true})
}

// ForceRelease marks the beat released, then writes the gate released.
func (s *releaseStore) ForceRelease(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return s.write(ctx, from, lockWrite{want: &rec})
}

// lockWrite is one write of a release lock (write).
type lockWrite struct {
	// want is the record to stand; nil leaves the record as from read it
	// (a queue write).
	want *lock.Record
	// queue replaces the waiters when setQueue is set.
	queue    []lock.Waiter
	setQueue bool
	// holder marks the holder's own write (a renewal, a revision, its
	// release): it goes on from a gate the holder's own writes moved.
	holder bool
	// take marks a take: it writes from what from read (see Take).
	take bool
}

// write writes w, from a snapshot, conditional on both the gate and the
// beat being as they were read (a newer revision than the gate means the
// lock moved: Conflict, so the caller reads it again). What is written
// depends on what changes:
//
//   - a take (another session than the gate's): the beat is claimed, then
//     the gate written;
//   - a person's release of another session (ReleasedBy): the beat is
//     marked released, then the gate written;
//   - the holder's own release: the gate only;
//   - a renewal or a revision named: the beat only;
//   - the queue: the beat only.
func (s *releaseStore) write(ctx context.Context, from *lock.Snapshot, w lockWrite) (*lock.Snapshot, error) {
	rel := releaseOf(from.Name)
	v := s.version(from)
	anchor := ""
	wasRev := 0
	if from.Newest != nil {
		anchor, wasRev = from.Newest.Name, from.Newest.Revision
	}
	gateRV, beatRV := v.gate, v.beat
	want, wantRaw := from.Record, from.Raw
	if w.want != nil {
		enc, err := w.want.Encode()
		if err != nil {
			return nil, err
		}
		want, wantRaw = w.want, enc
	}
	// A take writes from what it read (see Take).
	cached := w.take && anchor != ""
	if cached {
		if _, take := gateWrite(want, lock.AnnotatedRecord(v.record.Meta.Annotations)); !take {
			cached = false
		}
	}
	r, ok, listRV, beat, err := v.record, true, v.list, v.beatObj, error(nil)
	if !cached {
		r, ok, listRV, beat, err = s.read(ctx, rel)
	}
	switch {
	case err != nil:
		return nil, err
	case !ok && anchor == "":
		// Still no record: the virtual lock stays virtual.
		if w.holder {
			return s.renewVirtual(ctx, from, want, beat)
		}
		return holding(from, w.want, w.queue, w.setQueue)
	case !ok:
		return nil, apierrors.NewNotFound(leaseResource, from.Name)
	case anchor == "" || beat.rv() != beatRV:
		return nil, apierrors.NewConflict(leaseResource, from.Name, fmt.Errorf("the lock of release %q is now on %s at resourceVersion %s with beat at %q, not on %s at %s with beat at %q", rel, r.Meta.Name, r.Meta.ResourceVersion, beat.rv(), anchor, gateRV, beatRV))
	}
	have := lock.AnnotatedRecord(r.Meta.Annotations)
	if r.Meta.Name != anchor || r.Meta.ResourceVersion != gateRV {
		// The gate moved or changed since the caller read it. With the
		// beat unchanged, a gate that still carries the caller's own
		// unreleased record was rewritten by the holder's own writes
		// (helm's records, carrying the lock through the fence): the
		// holder's renewal, revision or release goes on from the gate as
		// read now. Anything else (a take, another session's record, a
		// release by someone else, no record) is a conflict: the caller
		// reads again and decides anew.
		//
		// Only the holder's own write (a waiter's queue write or a forced
		// release carries the holder's record from a view of its own), only
		// while the beat still names the holder unreleased, and only when
		// the gate did not move back to an older record (the newest was
		// deleted under the holder: part's vanished check decides).
		bt := beatRecord(beat)
		if want == nil || have == nil || want.Session != have.Session || !have.ReleasedAt.IsZero() ||
			!w.holder || r.Revision() < wasRev ||
			bt == nil || bt.Session != want.Session || !bt.ReleasedAt.IsZero() {
			return nil, apierrors.NewConflict(leaseResource, from.Name, fmt.Errorf("the lock of release %q is now on %s at resourceVersion %s with beat at %q, not on %s at %s with beat at %q", rel, r.Meta.Name, r.Meta.ResourceVersion, beat.rv(), anchor, gateRV, beatRV))
		}
		gateRV = r.Meta.ResourceVersion
	}
	cur := s.snapshot(rel, r, beat, listRV)
	gateChange, take := gateWrite(want, have)

	meta := beat.meta.DeepCopy()
	if !beat.exists {
		meta = &metav1.ObjectMeta{Name: lock.LeaseName(rel), Namespace: s.ns}
	}
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	for k, v := range beatLabels(rel) {
		meta.Labels[k] = v
	}
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	writeBeat := false
	setBeat := func(rec lock.Record, from *string, on string) error {
		enc, err := EncodeBeat(rec)
		if err != nil {
			return err
		}
		meta.Annotations[AnnotationBeat] = enc
		if from == nil {
			delete(meta.Annotations, AnnotationClaimedFrom)
		} else {
			meta.Annotations[AnnotationClaimedFrom] = *from
		}
		if on == "" {
			delete(meta.Annotations, AnnotationClaimedOn)
		} else {
			meta.Annotations[AnnotationClaimedOn] = on
		}
		writeBeat = true
		return nil
	}
	switch {
	case take:
		from := lock.SessionOf(have)
		if err := setBeat(*want, &from, lock.ClaimedOn(want.Session, r.Meta.Name, gateRV)); err != nil {
			return nil, err
		}
	case gateChange && want.ReleasedBy != "":
		if err := setBeat(*want, nil, ""); err != nil {
			return nil, err
		}
	case !gateChange && want != nil && wantRaw != cur.Raw:
		// A renewal or a revision named: the gate's holder's beat, which
		// claims from the holder itself (holding). A claim of another
		// session found there was made from a stale view of the gate (a
		// takeover of this holder names it in claimed-from, and part stops
		// on it before writing).
		from := want.Session
		if err := setBeat(*want, &from, ""); err != nil {
			return nil, err
		}
	}
	if w.setQueue && !sameQueue(w.queue, cur.Queue) {
		if len(w.queue) == 0 {
			delete(meta.Annotations, AnnotationWaiters)
		} else {
			enc, err := EncodeWaiters(w.queue)
			if err != nil {
				return nil, err
			}
			meta.Annotations[AnnotationWaiters] = enc
		}
		writeBeat = true
	}
	if writeBeat {
		if err := lock.Fenced(ctx); err != nil {
			return nil, err
		}
		if beat, err = s.beats.put(ctx, beat, *meta); err != nil {
			return nil, err
		}
	}
	if gateChange && cached {
		// Written from what the take read: the gate's record must still
		// be the newest (a record created since, by stock helm, say, would
		// carry no gate, and a second taker would take it there).
		rs, _, err := s.records.ListMeta(ctx, s.ns, historySelector(rel))
		if err != nil {
			return nil, err
		}
		if n, ok := records.NewestOf(rs); !ok || n.Meta.Name != r.Meta.Name || n.Meta.ResourceVersion != gateRV {
			return nil, apierrors.NewConflict(leaseResource, from.Name, fmt.Errorf("the newest record of release %q is no longer %s at resourceVersion %s", rel, r.Meta.Name, gateRV))
		}
	}
	if gateChange {
		unlabelled, told := r.Meta.Annotations[annotationUnlabelled]
		if r, err = s.writeGate(ctx, rel, r.Meta.Name, gateRV, *want); err != nil {
			return nil, err
		}
		if told {
			// What the read found of the other records still holds.
			markUnlabelled(&r, unlabelled)
		}
	}
	return s.snapshot(rel, r, beat, listRV), nil
}

// sameQueue tells whether two queues would be stored alike.
func sameQueue(a, b []lock.Waiter) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	ea, errA := lock.EncodeQueue(a)
	eb, errB := lock.EncodeQueue(b)
	return errA == nil && errB == nil && ea == eb
}

// writeGate writes want as the gate on record name of release rel,
// conditional on its resourceVersion rv, with one patch of its annotations
// (the lock record set, a queue of an earlier version removed); when the
// API server refuses patches (no patch right: remembered for the backend's
// life) or the client cannot make them, by reading the record and updating
// it whole. A record changed or deleted since rv is a Conflict on the
// lock: the caller reads again.
func (s *releaseStore) writeGate(ctx context.Context, rel, name, rv string, want lock.Record) (records.Record, error) {
	if err := lock.Fenced(ctx); err != nil {
		return records.Record{}, err
	}
	g := gateForm(want)
	enc, err := g.Encode()
	if err != nil {
		return records.Record{}, err
	}
	if !s.noPatch.Load() {
		r, err := s.records.PatchAnnotations(ctx, s.ns, name, rv, map[string]*string{lock.AnnotationRecord: &enc, lock.AnnotationQueue: nil}, FieldManager)
		switch {
		case err == nil:
			return r, nil
		case apierrors.IsConflict(err):
			return records.Record{}, apierrors.NewConflict(leaseResource, lock.LeaseName(rel), fmt.Errorf("the newest record %s of release %q changed", name, rel))
		case apierrors.IsNotFound(err):
			return records.Record{}, apierrors.NewConflict(leaseResource, lock.LeaseName(rel), fmt.Errorf("the newest record %s of release %q was deleted", name, rel))
		case errors.Is(err, records.ErrNoPatch), apierrors.IsForbidden(err):
			s.noPatch.Store(true)
		default:
			return records.Record{}, err
		}
	}
	full, err := s.records.Get(ctx, s.ns, name)
	switch {
	case apierrors.IsNotFound(err):
		return records.Record{}, apierrors.NewConflict(leaseResource, lock.LeaseName(rel), fmt.Errorf("the newest record %s of release %q was deleted", name, rel))
	case err != nil:
		return records.Record{}, err
	case full.Meta.ResourceVersion != rv:
		return records.Record{}, apierrors.NewConflict(leaseResource, lock.LeaseName(rel), fmt.Errorf("the newest record %s of release %q changed", name, rel))
	}
	if full.Meta.Annotations == nil {
		full.Meta.Annotations = map[string]string{}
	}
	full.Meta.Annotations[lock.AnnotationRecord] = enc
	delete(full.Meta.Annotations, lock.AnnotationQueue)
	if err := lock.Fenced(ctx); err != nil {
		return records.Record{}, err
	}
	return s.records.Update(ctx, full, FieldManager)
}

// releaseWhereWritten writes rec, the holder's own release, onto the
// record where its last fenced write left the lock (at, RecordAt),
// conditional on the resourceVersion that write returned, without reading
// the records or the beat: ok reports that it did. Nobody wrote that record
// since, so it still carries this holder's unreleased lock: a takeover, a
// person's release, stock helm's rewrite or the holder's own later write
// would each have changed it. A newer record written since (only by a
// client that takes no lock: the holder's own revision is no longer
// pending) carries no lock, and this one is left released. Anything else,
// or a record written since, goes the usual way (ok false, nil error):
// read, judge, write.
func (s *releaseStore) releaseWhereWritten(ctx context.Context, from *lock.Snapshot, rec lock.Record, at string) (*lock.Snapshot, bool, error) {
	if at == "" || rec.ReleasedAt.IsZero() || rec.ReleasedBy != "" {
		return nil, false, nil
	}
	name, rv, ok := strings.Cut(at, "@")
	if !ok {
		return nil, false, nil
	}
	rel := releaseOf(from.Name)
	r, err := s.writeGate(ctx, rel, name, rv, rec)
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	v := s.version(from)
	out := s.snapshot(rel, r, beatObj{}, v.list)
	ov := s.version(out)
	ov.beat = v.beat
	out.Version = ov
	return out, true, nil
}

// gateWrite says whether writing want over the gate's record have changes
// the gate (another holder, or a release mark), and whether that write is a
// take: any write of an unreleased record to the gate is one (of another
// session's lock, or again of our own released one), and the beat is
// claimed first, so no beat left from before stands for it.
func gateWrite(want, have *lock.Record) (gateChange, take bool) {
	gateChange = want != nil && (have == nil || want.Session != have.Session ||
		!want.ReleasedAt.Equal(have.ReleasedAt) || want.ReleasedBy != have.ReleasedBy)
	return gateChange, gateChange && want.ReleasedAt.IsZero()
}

// renewVirtual is the holder's write of a lock taken while the release had
// no record (virtual): nothing is written, unless it is a renewal and the
// holder wrote its beat already, just before its first revision's create
// (ensureBeat). Everybody else judges its lock by that beat then (a claim
// from no record, rule 5 of docs/protocol.md): the renewal renews it, as a
// renewal of a gate's holder does, conditional on the beat as read.
// Otherwise the holder's renew deadline moved on while the LOCKED TILL the
// others read stood still, and it wrote past it (the simulation, seed
// 13466: helm's create of revision 1, retried after a 429, sent 0.9 s
// after the beat's LOCKED TILL less the renew margin).
func (s *releaseStore) renewVirtual(ctx context.Context, from *lock.Snapshot, want *lock.Record, beat beatObj) (*lock.Snapshot, error) {
	bt := beatRecord(beat)
	if want == nil || bt == nil || bt.Session != want.Session ||
		!bt.ReleasedAt.IsZero() || !want.ReleasedAt.IsZero() || !want.RenewedAt.After(bt.RenewedAt) {
		return holding(from, want, nil, false)
	}
	enc, err := EncodeBeat(*want)
	if err != nil {
		return nil, err
	}
	meta := beat.meta.DeepCopy()
	meta.Annotations[AnnotationBeat] = enc
	if err := lock.Fenced(ctx); err != nil {
		return nil, err
	}
	written, err := s.beats.put(ctx, beat, *meta)
	if apierrors.IsConflict(err) {
		return nil, apierrors.NewConflict(leaseResource, from.Name, err)
	}
	if err != nil {
		return nil, err
	}
	return holding(withBeatVersion(from, written.rv()), want, nil, false)
}

// ensureBeat makes the beat name rec's holder, for a lock taken while the
// release had no record (virtual: the take wrote nothing) just before the
// holder's first revision, carrying the gate, is created. Without it the
// new gate would be judged by its long bound until the first renewal (see
// virtual). A beat naming another session is overwritten: whichever
// create of the first revision wins holds the lock, and a beat naming the
// loser is a claim from a stale view its holder overwrites. Once a record
// exists the race is lost (the create that follows fails) and nothing is
// written: a loser's beat over the winner's would hide the winner's
// renewals (found by review). It returns the beat's resourceVersion.
func (s *releaseStore) ensureBeat(ctx context.Context, rec lock.Record) (string, error) {
	for range 3 {
		// One list returns the records and the beat (see read).
		_, exists, _, beat, err := s.read(ctx, rec.Release)
		if err != nil {
			return "", err
		}
		if exists {
			return "", fmt.Errorf("release %q in namespace %q has a stored revision already: its first revision's create is lost", rec.Release, s.ns)
		}
		if b := beatRecord(beat); b != nil && b.Session == rec.Session && b.ReleasedAt.IsZero() {
			return beat.rv(), nil
		}
		meta := beat.meta.DeepCopy()
		if !beat.exists {
			meta = &metav1.ObjectMeta{Name: lock.LeaseName(rec.Release), Namespace: s.ns}
		}
		if meta.Labels == nil {
			meta.Labels = map[string]string{}
		}
		for k, v := range beatLabels(rec.Release) {
			meta.Labels[k] = v
		}
		if meta.Annotations == nil {
			meta.Annotations = map[string]string{}
		}
		enc, err := EncodeBeat(rec)
		if err != nil {
			return "", err
		}
		meta.Annotations[AnnotationBeat] = enc
		meta.Annotations[AnnotationClaimedFrom] = rec.Session // holding (see Update)
		delete(meta.Annotations, AnnotationClaimedOn)
		if err := lock.Fenced(ctx); err != nil {
			return "", err
		}
		written, err := s.beats.put(ctx, beat, *meta)
		if err == nil {
			return written.rv(), nil
		}
		if !apierrors.IsConflict(err) {
			return "", err
		}
	}
	return "", fmt.Errorf("the lock's beat %s of release %q in namespace %q kept changing", lock.LeaseName(rec.Release), rec.Release, s.ns)
}

// Announce implements Store: for a virtual lock (the release has no
// record yet) it writes the beat naming rec (ensureBeat) and returns from
// with that beat's version, so that a release deleting the beat (the
// first revision was never written) removes exactly this one.
func (s *releaseStore) Announce(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	if from.Newest != nil {
		return from, nil
	}
	beatRV, err := s.ensureBeat(ctx, rec)
	if err != nil {
		return nil, err
	}
	return withBeatVersion(from, beatRV), nil
}

// Renewal implements Store: the beat's holder, renewal and LOCKED TILL,
// unless it was released.
func (s *releaseStore) Renewal(name string, obj runtime.Object) (string, time.Time, time.Time, bool) {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetName() != name {
		return "", time.Time{}, time.Time{}, false
	}
	bt := decodeBeat(m.GetAnnotations()[AnnotationBeat], releaseOf(name), s.ns)
	if bt == nil || !bt.ReleasedAt.IsZero() {
		return "", time.Time{}, time.Time{}, false
	}
	return bt.Session, bt.RenewedAt, bt.LockedTill, true
}

// Delete removes the lock of a release whose records helm deleted
// (uninstall) or is about to keep without one: the beat object, then the
// gate's annotations, each conditional on the resourceVersion from read.
func (s *releaseStore) Delete(ctx context.Context, from *lock.Snapshot) error {
	name := from.Name
	rel := releaseOf(name)
	r, ok, _, beat, err := s.read(ctx, rel)
	if err != nil {
		return err
	}
	v := s.version(from)
	gateRV, beatRV := v.gate, v.beat
	if beat.rv() != beatRV || (ok && r.Meta.ResourceVersion != gateRV) {
		return apierrors.NewConflict(leaseResource, name, fmt.Errorf("the lock of release %q changed", rel))
	}
	if err := s.beats.remove(ctx, beat); err != nil {
		if apierrors.IsConflict(err) {
			return apierrors.NewConflict(leaseResource, name, err)
		}
		return err
	}
	if !ok {
		return apierrors.NewNotFound(leaseResource, name)
	}
	full, err := s.records.Get(ctx, s.ns, r.Meta.Name)
	switch {
	case apierrors.IsNotFound(err):
		return apierrors.NewNotFound(leaseResource, name)
	case err != nil:
		return err
	case gateRV != "" && full.Meta.ResourceVersion != gateRV:
		return apierrors.NewConflict(leaseResource, name, fmt.Errorf("the newest record of release %q changed", rel))
	}
	delete(full.Meta.Annotations, lock.AnnotationRecord)
	delete(full.Meta.Annotations, lock.AnnotationQueue)
	_, err = s.records.Update(ctx, full, FieldManager)
	return err
}

// List returns the lock of every release whose newest record carries a
// lock record.
func (s *releaseStore) List(ctx context.Context) ([]*lock.Snapshot, error) {
	// The lock lives in the records' metadata and the beat objects: the
	// records' payloads (helm's release data, up to 1 MiB each) are not
	// read.
	rs, listRV, err := s.records.ListMeta(ctx, s.ns, recordLabelOwner+"="+recordOwnerHelm)
	if err != nil {
		return nil, fmt.Errorf("reading helm's release records in namespace %q: %w", s.ns, err)
	}
	bs, err := s.beats.list(ctx, s.ns)
	if err != nil {
		return nil, fmt.Errorf("reading the locks' beats in namespace %q: %w", s.ns, err)
	}
	beatOf := map[string]beatObj{}
	for _, b := range bs {
		beatOf[b.meta.Namespace+"/"+b.meta.Labels[lock.LabelRelease]] = b
	}
	byRelease := map[string][]records.Record{}
	for _, r := range rs {
		k := r.Meta.Namespace + "/" + r.Meta.Labels[recordLabelName]
		byRelease[k] = append(byRelease[k], r)
	}
	out := make([]*lock.Snapshot, 0, len(byRelease))
	for k, group := range byRelease {
		r, _ := records.NewestOf(group)
		if _, ok := r.Meta.Annotations[lock.AnnotationRecord]; !ok {
			continue
		}
		out = append(out, s.snapshot(r.Meta.Labels[recordLabelName], r, beatOf[k], listRV))
	}
	slices.SortFunc(out, func(a, b *lock.Snapshot) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// Watch watches every stored revision of the release and its beat object.
// Waiters only need to know that something changed; they read the lock
// again on every event that can change their decision (see
// watchView.quiet).
func (s *releaseStore) Watch(ctx context.Context, from *lock.Snapshot) (watch.Interface, error) {
	v := s.version(from)
	at := v.list
	if at == "" {
		at = v.gate
	}
	gw, err := s.records.Watch(ctx, s.ns, historySelector(releaseOf(from.Name)), at)
	if err != nil {
		return nil, err
	}
	bw, err := s.beats.watch(ctx, s.ns, from.Name, at)
	if err != nil {
		gw.Stop()
		return nil, err
	}
	return mergeWatches(gw, bw), nil
}

// WatchQueue watches the beat, where the queue lives.
func (s *releaseStore) WatchQueue(ctx context.Context, name string) (watch.Interface, func(runtime.Object) ([]lock.Waiter, bool), error) {
	w, err := s.beats.watch(ctx, s.ns, name, "")
	return w, func(o runtime.Object) ([]lock.Waiter, bool) {
		m, err := meta.Accessor(o)
		if err != nil || m.GetName() != name {
			return nil, false
		}
		return DecodeWaiters(m.GetAnnotations()[AnnotationWaiters]), true
	}, err
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// NewStore returns the release store of namespace ns (see NewBackend).
func NewStore(client kubernetes.Interface, driver records.Driver, ns string) lock.Store {
	store := records.New(client, driver)
	return &releaseStore{records: store, beats: beats{client: client, kind: store.Kind(), unlisted: &atomic.Bool{}}, ns: ns, seen: &lastReads{}, noPatch: &atomic.Bool{}}
}

// Snapshot is the lock of release as the release store reads it from its
// newest record (gate), its beat object (nil when there is none) and the
// resourceVersion of the list that returned them.
func Snapshot(ns, release string, gate records.Record, beat *metav1.ObjectMeta, listRV string) *lock.Snapshot {
	b := beatObj{}
	if beat != nil {
		b = beatObj{exists: true, meta: *beat}
	}
	return (&releaseStore{ns: ns}).snapshot(release, gate, b, listRV)
}
