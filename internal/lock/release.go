package lock

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Helm's storage labels, the same on Secrets and ConfigMaps (package helmx
// owns the full codec, package records the revision number; the lock needs
// only these to find a release's records).
const (
	recordLabelOwner = "owner"
	recordLabelName  = "name"
	recordOwnerHelm  = "helm"
)

// FieldManager names the lock's writes to release records in managedFields.
// Readers that date a revision by its last write (helmx.Summarize) skip it:
// taking or renewing a lock is not a change of the release.
const FieldManager = "helm-autorecover-lock"

// annotationAnchor names, on a virtual Lease only (never stored), the record
// the lock was read from, so that a write goes to that record or conflicts.
const annotationAnchor = "helm-autorecover.io/anchor"

// annotationAnchorRef names the same record as kubectl does (secret/NAME or
// configmap/NAME), on a virtual Lease only, for messages.
const annotationAnchorRef = "helm-autorecover.io/anchor-ref"

// annotationAnchorRevision is the revision number of the anchor record, on a
// virtual Lease only: a holder whose lock is found on an older revision than
// the one it was on knows the newer record was deleted under it.
const annotationAnchorRevision = "helm-autorecover.io/anchor-revision"

// unreadableHolder stands for the holder of a lock record that is not JSON
// at all: the lock is judged Live (its expiry cannot be told) until someone
// unlocks it with --force naming this session.
const unreadableHolder = "unreadable-lock-record"

// NewReleaseBackend returns a backend that keeps each release's lock in the
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
// record (see Held.reread); it never writes its lock back.
func NewReleaseBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, driver records.Driver) *Backend {
	store := records.New(client, driver)
	return &Backend{
		client: client, time: est, clock: clk, Margin: TakeoverMargin, RenewMargin: RenewMargin, store: StoreRelease,
		api: func(ns string) leaseAPI { return &releaseStore{records: store, ns: ns} },
	}
}

// releaseStore shows each release's newest record to the protocol as a
// virtual Lease named LeaseName(release).
type releaseStore struct {
	records records.Store
	ns      string
}

func historySelector(release string) string {
	return recordLabelOwner + "=" + recordOwnerHelm + "," + recordLabelName + "=" + release
}

func releaseOf(leaseName string) string { return strings.TrimPrefix(leaseName, LeasePrefix) }

func (s *releaseStore) latest(ctx context.Context, release string) (records.Record, bool, string, error) {
	r, ok, listRV, err := s.records.Newest(ctx, s.ns, historySelector(release))
	if err != nil {
		return records.Record{}, false, "", fmt.Errorf("reading the stored revisions of release %q in namespace %q: %w", release, s.ns, err)
	}
	return r, ok, listRV, nil
}

// virtualLease renders record r of release as the Lease the protocol reads:
// the lock annotations are copied, the spec is derived from the record.
func virtualLease(release string, r records.Record) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:            LeaseName(release),
		Namespace:       r.Meta.Namespace,
		ResourceVersion: r.Meta.ResourceVersion,
		UID:             r.Meta.UID,
		Labels:          leaseLabels(release),
		Annotations: map[string]string{
			annotationAnchor:         r.Meta.Name,
			annotationAnchorRef:      strings.ToLower(r.Kind) + "/" + r.Meta.Name,
			annotationAnchorRevision: strconv.Itoa(r.Revision()),
		},
	}}
	for _, k := range []string{AnnotationRecord, AnnotationQueue} {
		if v, ok := r.Meta.Annotations[k]; ok {
			l.Annotations[k] = v
		}
	}
	l.Spec = specOf(r.Meta.Annotations[AnnotationRecord])
	return l
}

// specOf derives the Lease spec from a stored record. Session, renewedAt,
// leaseDuration and releasedAt keep their meaning in every schema (they play
// the part of the Lease spec), so a record of a newer schema is still judged
// by them; a record that is not JSON at all names an unreadable holder with
// no expiry, which is judged Live.
func specOf(s string) coordinationv1.LeaseSpec {
	if s == "" {
		return coordinationv1.LeaseSpec{}
	}
	rec, _ := DecodeRecord(s) // a newer schema's record is still judged; see above
	if rec == nil {
		return coordinationv1.LeaseSpec{HolderIdentity: ptr(unreadableHolder)}
	}
	if !rec.ReleasedAt.IsZero() || rec.Session == "" {
		return coordinationv1.LeaseSpec{HolderIdentity: ptr("")}
	}
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr(rec.Session)}
	if d := rec.LeaseDuration.Duration; d > 0 && !rec.RenewedAt.IsZero() {
		spec.LeaseDurationSeconds = ptr(int32(min(math.MaxInt32, math.Ceil(d.Seconds()))))
		spec.RenewTime = &metav1.MicroTime{Time: rec.RenewedAt}
	}
	if !rec.AcquiredAt.IsZero() {
		spec.AcquireTime = &metav1.MicroTime{Time: rec.AcquiredAt}
	}
	return spec
}

var leaseResource = coordinationv1.Resource("leases")

func (s *releaseStore) Get(ctx context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	rel := releaseOf(name)
	r, ok, _, err := s.latest(ctx, rel)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierrors.NewNotFound(leaseResource, name)
	}
	return virtualLease(rel, r), nil
}

// Create takes the lock of a release that has no stored revision: nothing is
// written (there is no record yet). The virtual Lease returned carries the
// list's resourceVersion, so a watch from it misses nothing, and no anchor.
func (s *releaseStore) Create(ctx context.Context, l *coordinationv1.Lease, _ metav1.CreateOptions) (*coordinationv1.Lease, error) {
	_, ok, listRV, err := s.latest(ctx, releaseOf(l.Name))
	if err != nil {
		return nil, err
	}
	if ok {
		return nil, apierrors.NewAlreadyExists(leaseResource, l.Name)
	}
	out := l.DeepCopy()
	out.ResourceVersion = listRV
	delete(out.Annotations, annotationAnchor)
	delete(out.Annotations, annotationAnchorRevision)
	return out, nil
}

// Update writes the lock annotations of l to its anchor record, conditional
// on the resourceVersion l was read at. A newer revision than the anchor
// means the lock moved: Conflict, so the caller reads it again.
func (s *releaseStore) Update(ctx context.Context, l *coordinationv1.Lease, _ metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	rel := releaseOf(l.Name)
	anchor := l.Annotations[annotationAnchor]
	r, ok, _, err := s.latest(ctx, rel)
	switch {
	case err != nil:
		return nil, err
	case !ok && anchor == "":
		// Still no record: the virtual lock stays virtual.
		return l.DeepCopy(), nil
	case !ok:
		return nil, apierrors.NewNotFound(leaseResource, l.Name)
	case anchor == "" || r.Meta.Name != anchor || r.Meta.ResourceVersion != l.ResourceVersion:
		return nil, apierrors.NewConflict(leaseResource, l.Name, fmt.Errorf("the newest record of release %q is %s at resourceVersion %s, not %s at %s", rel, r.Meta.Name, r.Meta.ResourceVersion, anchor, l.ResourceVersion))
	}
	setLockAnnotations(&r.Meta, l.Annotations)
	u, err := s.records.Update(ctx, r, FieldManager)
	if err != nil {
		return nil, err
	}
	return virtualLease(rel, u), nil
}

// setLockAnnotations copies the lock annotations of from onto m, removing
// those from lacks.
func setLockAnnotations(m *metav1.ObjectMeta, from map[string]string) {
	for _, k := range []string{AnnotationRecord, AnnotationQueue} {
		v, ok := from[k]
		switch {
		case ok:
			if m.Annotations == nil {
				m.Annotations = map[string]string{}
			}
			m.Annotations[k] = v
		default:
			delete(m.Annotations, k)
		}
	}
}

// Delete removes the lock annotations from the newest record, conditional on
// the resourceVersion in opts.
func (s *releaseStore) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	rel := releaseOf(name)
	r, ok, _, err := s.latest(ctx, rel)
	if err != nil {
		return err
	}
	if !ok {
		return apierrors.NewNotFound(leaseResource, name)
	}
	if p := opts.Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != r.Meta.ResourceVersion {
		return apierrors.NewConflict(leaseResource, name, fmt.Errorf("the newest record of release %q changed", rel))
	}
	setLockAnnotations(&r.Meta, nil)
	_, err = s.records.Update(ctx, r, FieldManager)
	return err
}

// List returns the virtual Lease of every release whose newest record
// carries a lock record. The label selector in opts is ignored: every such
// lock is this tool's.
func (s *releaseStore) List(ctx context.Context, _ metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	// The lock lives in the records' metadata: their payloads (helm's
	// release data, up to 1 MiB each) are not read.
	rs, listRV, err := s.records.ListMeta(ctx, s.ns, recordLabelOwner+"="+recordOwnerHelm)
	if err != nil {
		return nil, fmt.Errorf("reading helm's release records in namespace %q: %w", s.ns, err)
	}
	byRelease := map[string][]records.Record{}
	for _, r := range rs {
		k := r.Meta.Namespace + "/" + r.Meta.Labels[recordLabelName]
		byRelease[k] = append(byRelease[k], r)
	}
	out := &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: listRV}}
	for _, group := range byRelease {
		r, _ := records.NewestOf(group)
		if _, ok := r.Meta.Annotations[AnnotationRecord]; !ok {
			continue
		}
		out.Items = append(out.Items, *virtualLease(r.Meta.Labels[recordLabelName], r))
	}
	slices.SortFunc(out.Items, func(a, b coordinationv1.Lease) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// Watch watches every stored revision of the release named by the field
// selector metadata.name=LeaseName(release). Waiters only need to know that
// something changed; they read the lock again on every event.
func (s *releaseStore) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	sel, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, fmt.Errorf("watching a release lock: %w", err)
	}
	name, ok := sel.RequiresExactMatch("metadata.name")
	if !ok {
		return nil, fmt.Errorf("watching a release lock needs the field selector metadata.name=%sRELEASE", LeasePrefix)
	}
	return s.records.Watch(ctx, s.ns, historySelector(releaseOf(name)), opts.ResourceVersion)
}
