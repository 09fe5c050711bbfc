package lock

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Driver names the helm storage driver (HELM_DRIVER) whose records carry
// in-release locks.
type Driver string

// The drivers the release store works with. Helm's sql driver keeps releases
// outside Kubernetes and memory keeps them in the process: neither has a
// record to put a lock on (see ParseDriver).
const (
	DriverSecret    Driver = "secret"
	DriverConfigMap Driver = "configmap"
)

// ErrNoReleaseRecords: the storage driver keeps no Kubernetes record that an
// in-release lock could live on.
var ErrNoReleaseRecords = fmt.Errorf("this helm storage driver keeps no Kubernetes record for an in-release lock")

// ParseDriver maps a HELM_DRIVER value onto the driver whose records carry the
// lock, as helm does ("" and "secrets" mean secret, "configmaps" configmap).
// The sql and memory drivers return an error wrapping ErrNoReleaseRecords
// that says which backend to use instead.
func ParseDriver(helmDriver string) (Driver, error) {
	switch helmDriver {
	case "", "secret", "secrets":
		return DriverSecret, nil
	case "configmap", "configmaps":
		return DriverConfigMap, nil
	case "sql":
		return "", fmt.Errorf("HELM_DRIVER=sql stores releases in a SQL database, outside Kubernetes, so --lock-backend=release is not available; use --lock-backend=lease (a coordination.k8s.io Lease per release): %w", ErrNoReleaseRecords)
	case "memory":
		return "", fmt.Errorf("HELM_DRIVER=memory keeps releases inside one process; there is nothing to lock: %w", ErrNoReleaseRecords)
	}
	return "", fmt.Errorf("HELM_DRIVER=%q is not a helm storage driver (secret, configmap, sql or memory)", helmDriver)
}

// Helm's storage labels, the same on Secrets and ConfigMaps (package helmx
// owns the full codec; the lock needs only these to find the newest record).
const (
	recordLabelOwner   = "owner"
	recordLabelName    = "name"
	recordLabelVersion = "version"
	recordOwnerHelm    = "helm"
)

// FieldManager names the lock's writes to release records in managedFields.
// Readers that date a revision by its last write (helmx.Summarize) skip it:
// taking or renewing a lock is not a change of the release.
const FieldManager = "helm-autorecover-lock"

// annotationAnchor names, on a virtual Lease only (never stored), the record
// the lock was read from, so that a write goes to that record or conflicts.
const annotationAnchor = "helm-autorecover.io/anchor"

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
// Stock helm rebuilds a record when it rewrites it (annotations vanish) and
// never copies annotations to the next revision, so a lock never outlives a
// stock helm write and a stale lock is never carried forward.
func NewReleaseBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, driver Driver) *LeaseBackend {
	return &LeaseBackend{
		client: client, time: est, clock: clk, Margin: DefaultMargin, store: StoreRelease,
		api: func(ns string) leaseAPI { return &releaseStore{records: newRecordAPI(client, ns, driver), ns: ns} },
	}
}

// record is one stored revision, Secret or ConfigMap.
type record struct {
	meta *metav1.ObjectMeta
	// obj is the *corev1.Secret or *corev1.ConfigMap meta points into.
	obj any
}

func (r record) revision() int {
	n, _ := strconv.Atoi(r.meta.Labels[recordLabelVersion])
	return n
}

// recordAPI reads and writes one driver's records in one namespace.
type recordAPI interface {
	list(ctx context.Context, selector string) ([]record, string, error)
	update(ctx context.Context, r record) (record, error)
	watch(ctx context.Context, selector, rv string) (watch.Interface, error)
}

func newRecordAPI(client kubernetes.Interface, ns string, driver Driver) recordAPI {
	if driver == DriverConfigMap {
		return configMapRecords{client.CoreV1().ConfigMaps(ns)}
	}
	return secretRecords{client.CoreV1().Secrets(ns)}
}

type secretRecords struct {
	c interface {
		List(context.Context, metav1.ListOptions) (*corev1.SecretList, error)
		Update(context.Context, *corev1.Secret, metav1.UpdateOptions) (*corev1.Secret, error)
		Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
	}
}

func (s secretRecords) list(ctx context.Context, selector string) ([]record, string, error) {
	l, err := s.c.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, "", err
	}
	out := make([]record, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, record{meta: &l.Items[i].ObjectMeta, obj: &l.Items[i]})
	}
	return out, l.ResourceVersion, nil
}

func (s secretRecords) update(ctx context.Context, r record) (record, error) {
	u, err := s.c.Update(ctx, r.obj.(*corev1.Secret), metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return record{}, err
	}
	return record{meta: &u.ObjectMeta, obj: u}, nil
}

func (s secretRecords) watch(ctx context.Context, selector, rv string) (watch.Interface, error) {
	return s.c.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
}

type configMapRecords struct {
	c interface {
		List(context.Context, metav1.ListOptions) (*corev1.ConfigMapList, error)
		Update(context.Context, *corev1.ConfigMap, metav1.UpdateOptions) (*corev1.ConfigMap, error)
		Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
	}
}

func (s configMapRecords) list(ctx context.Context, selector string) ([]record, string, error) {
	l, err := s.c.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, "", err
	}
	out := make([]record, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, record{meta: &l.Items[i].ObjectMeta, obj: &l.Items[i]})
	}
	return out, l.ResourceVersion, nil
}

func (s configMapRecords) update(ctx context.Context, r record) (record, error) {
	u, err := s.c.Update(ctx, r.obj.(*corev1.ConfigMap), metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return record{}, err
	}
	return record{meta: &u.ObjectMeta, obj: u}, nil
}

func (s configMapRecords) watch(ctx context.Context, selector, rv string) (watch.Interface, error) {
	return s.c.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
}

// releaseStore shows each release's newest record to the protocol as a
// virtual Lease named LeaseName(release).
type releaseStore struct {
	records recordAPI
	ns      string
}

func historySelector(release string) string {
	return recordLabelOwner + "=" + recordOwnerHelm + "," + recordLabelName + "=" + release
}

func releaseOf(leaseName string) string { return strings.TrimPrefix(leaseName, LeasePrefix) }

// newest returns the record of the highest revision, and false when the
// release has none.
func newest(rs []record) (record, bool) {
	if len(rs) == 0 {
		return record{}, false
	}
	return slices.MaxFunc(rs, func(a, b record) int { return a.revision() - b.revision() }), true
}

func (s *releaseStore) latest(ctx context.Context, release string) (record, bool, string, error) {
	rs, listRV, err := s.records.list(ctx, historySelector(release))
	if err != nil {
		return record{}, false, "", fmt.Errorf("reading the stored revisions of release %q in namespace %q: %w", release, s.ns, err)
	}
	r, ok := newest(rs)
	return r, ok, listRV, nil
}

// virtualLease renders record r of release as the Lease the protocol reads:
// the lock annotations are copied, the spec is derived from the record.
func virtualLease(release string, r record) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:            LeaseName(release),
		Namespace:       r.meta.Namespace,
		ResourceVersion: r.meta.ResourceVersion,
		UID:             r.meta.UID,
		Labels:          leaseLabels(release),
		Annotations:     map[string]string{annotationAnchor: r.meta.Name},
	}}
	for _, k := range []string{AnnotationRecord, AnnotationQueue} {
		if v, ok := r.meta.Annotations[k]; ok {
			l.Annotations[k] = v
		}
	}
	l.Spec = specOf(r.meta.Annotations[AnnotationRecord])
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
	case anchor == "" || r.meta.Name != anchor || r.meta.ResourceVersion != l.ResourceVersion:
		return nil, apierrors.NewConflict(leaseResource, l.Name, fmt.Errorf("the newest record of release %q is %s at resourceVersion %s, not %s at %s", rel, r.meta.Name, r.meta.ResourceVersion, anchor, l.ResourceVersion))
	}
	setLockAnnotations(r.meta, l.Annotations)
	u, err := s.records.update(ctx, r)
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
	if p := opts.Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != r.meta.ResourceVersion {
		return apierrors.NewConflict(leaseResource, name, fmt.Errorf("the newest record of release %q changed", rel))
	}
	setLockAnnotations(r.meta, nil)
	_, err = s.records.update(ctx, r)
	return err
}

// List returns the virtual Lease of every release whose newest record
// carries a lock record. The label selector in opts is ignored: every such
// lock is this tool's.
func (s *releaseStore) List(ctx context.Context, _ metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	rs, listRV, err := s.records.list(ctx, recordLabelOwner+"="+recordOwnerHelm)
	if err != nil {
		return nil, fmt.Errorf("reading helm's release records in namespace %q: %w", s.ns, err)
	}
	byRelease := map[string][]record{}
	for _, r := range rs {
		k := r.meta.Namespace + "/" + r.meta.Labels[recordLabelName]
		byRelease[k] = append(byRelease[k], r)
	}
	out := &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: listRV}}
	for _, group := range byRelease {
		r, _ := newest(group)
		if _, ok := r.meta.Annotations[AnnotationRecord]; !ok {
			continue
		}
		out.Items = append(out.Items, *virtualLease(r.meta.Labels[recordLabelName], r))
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
	return s.records.watch(ctx, historySelector(releaseOf(name)), opts.ResourceVersion)
}
