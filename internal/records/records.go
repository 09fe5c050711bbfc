// Package records reads and writes helm's release records: the Secrets of
// helm's default "secret" storage driver or the ConfigMaps of its
// "configmap" driver, one per revision, with the same labels and the same
// encoded release in data["release"]. It knows nothing of the release JSON
// (package helmx decodes it) nor of locks (package lock keeps its record on
// them); both build on it. Every update is conditional on the
// resourceVersion the record was read at.
package records

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// Driver names a helm storage driver (HELM_DRIVER) that keeps its records in
// Kubernetes.
type Driver string

// The drivers with Kubernetes records. Helm's sql driver keeps releases
// outside Kubernetes and memory keeps them in the process (see ParseDriver).
const (
	DriverSecret    Driver = "secret"
	DriverConfigMap Driver = "configmap"
)

// ErrNoReleaseRecords: the storage driver keeps no Kubernetes record (sql,
// memory).
var ErrNoReleaseRecords = errors.New("this helm storage driver keeps no Kubernetes record for an in-release lock")

// ParseDriver maps a HELM_DRIVER value onto its driver, as helm does (""
// and "secrets" mean secret, "configmaps" configmap). The sql and memory
// drivers return an error wrapping ErrNoReleaseRecords that says where
// their releases are.
func ParseDriver(helmDriver string) (Driver, error) {
	switch helmDriver {
	case "", "secret", "secrets":
		return DriverSecret, nil
	case "configmap", "configmaps":
		return DriverConfigMap, nil
	case "sql":
		return "", fmt.Errorf("HELM_DRIVER=sql stores releases in a SQL database, outside Kubernetes (package sqlstore keeps the lock and reads the history there): %w", ErrNoReleaseRecords)
	case "memory":
		return "", fmt.Errorf("HELM_DRIVER=memory keeps releases inside one process; there is nothing to lock: %w", ErrNoReleaseRecords)
	}
	return "", fmt.Errorf("HELM_DRIVER=%q is not a helm storage driver (secret, configmap, sql or memory)", helmDriver)
}

// The kinds of object the drivers keep revisions in.
const (
	KindSecret    = "Secret"
	KindConfigMap = "ConfigMap"
)

// DataKey is the data key that holds the encoded release, in a Secret's data
// and in a ConfigMap's.
const DataKey = "release"

// Record is one stored release revision.
type Record struct {
	// Kind is KindSecret or KindConfigMap.
	Kind string
	Meta metav1.ObjectMeta
	// Payload is data["release"] as stored: base64 text of the gzipped JSON.
	Payload []byte
	// obj is the object read, so that an update rewrites only what the
	// caller changed (Meta and Payload).
	obj any
}

// FromSecret views a release Secret as a Record.
func FromSecret(s *corev1.Secret) Record {
	return Record{Kind: KindSecret, Meta: s.ObjectMeta, Payload: s.Data[DataKey], obj: s}
}

// FromConfigMap views a release ConfigMap as a Record.
func FromConfigMap(c *corev1.ConfigMap) Record {
	var payload []byte
	if v, ok := c.Data[DataKey]; ok {
		payload = []byte(v)
	}
	return Record{Kind: KindConfigMap, Meta: c.ObjectMeta, Payload: payload, obj: c}
}

// HasPayload reports whether the record has a data["release"] key at all.
func (r Record) HasPayload() bool {
	switch o := r.obj.(type) {
	case *corev1.Secret:
		_, ok := o.Data[DataKey]
		return ok
	case *corev1.ConfigMap:
		_, ok := o.Data[DataKey]
		return ok
	}
	return r.Payload != nil
}

// Secret returns the Secret the record was read as, nil for a ConfigMap.
func (r Record) Secret() *corev1.Secret {
	s, _ := r.obj.(*corev1.Secret)
	return s
}

// Ref refers to the record, for an Event.
func (r Record) Ref() corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion:      "v1",
		Kind:            r.Kind,
		Namespace:       r.Meta.Namespace,
		Name:            r.Meta.Name,
		UID:             r.Meta.UID,
		ResourceVersion: r.Meta.ResourceVersion,
	}
}

// Describe names the record for messages: `Secret "x" in namespace "y"`.
func (r Record) Describe() string {
	return fmt.Sprintf("%s %q in namespace %q", r.Kind, r.Meta.Name, r.Meta.Namespace)
}

// Store reads and writes the records of one driver.
type Store struct {
	client kubernetes.Interface
	kind   string
}

// New returns the store of driver.
func New(client kubernetes.Interface, driver Driver) Store {
	if driver == DriverConfigMap {
		return Store{client: client, kind: KindConfigMap}
	}
	return Store{client: client, kind: KindSecret}
}

// ForHelmDriver returns the store of a HELM_DRIVER value; see ParseDriver.
func ForHelmDriver(client kubernetes.Interface, helmDriver string) (Store, error) {
	d, err := ParseDriver(helmDriver)
	if err != nil {
		return Store{}, err
	}
	return New(client, d), nil
}

// Kind is KindSecret or KindConfigMap.
func (s Store) Kind() string { return s.kind }

// ReadCommand is the kubectl command that shows record name in ns.
func (s Store) ReadCommand(ns, name string) string {
	return fmt.Sprintf("%s -n %s %s -o yaml", s.Kubectl(), ns, name)
}

// WriteFenced is false: the API server writes whatever a caller with the
// rights sends, and the lock's holder is checked by the writer (the lock
// the record carries) and by package helmx's write fence.
func (s Store) WriteFenced() bool { return false }

// Resource is the API resource of the records ("secrets" or "configmaps").
func (s Store) Resource() string {
	if s.kind == KindConfigMap {
		return "configmaps"
	}
	return "secrets"
}

// Kubectl is how a person reads one record: "kubectl get secret".
func (s Store) Kubectl() string {
	if s.kind == KindConfigMap {
		return "kubectl get configmap"
	}
	return "kubectl get secret"
}

// notOlderThanKey carries, in a context, the resourceVersion the first
// List or ListMeta under it reads "not older than" (WithNotOlderThan).
type notOlderThanKey struct{}

type floor struct {
	rv   string
	used atomic.Bool
}

// WithNotOlderThan returns ctx for reads of which the first List or
// ListMeta may be served from the API server's cache as soon as it holds
// everything up to resourceVersion rv (resourceVersionMatch NotOlderThan),
// instead of a fully consistent read, which right after a write can wait
// for the cache to confirm it is current (40-90 ms on the local cluster).
// Later reads under ctx are consistent (a conflict's re-read must see the
// write that caused it), and so is the first when the floored read fails
// (a cache that cannot catch up, a server that refuses the option). Use it
// only with the resourceVersion of a write whose effects (and everything
// before it) the read must see. An empty rv changes nothing.
func WithNotOlderThan(ctx context.Context, rv string) context.Context {
	if rv == "" {
		return ctx
	}
	return context.WithValue(ctx, notOlderThanKey{}, &floor{rv: rv})
}

// Floored reports whether the next List or ListMeta under ctx is the
// floored one (WithNotOlderThan): served from the API server's cache, so
// what it returns may be older than a consistent read would be, down to
// the floor.
func Floored(ctx context.Context) bool {
	f, _ := ctx.Value(notOlderThanKey{}).(*floor)
	return f != nil && !f.used.Load()
}

// floorOf returns the floor of ctx for the first read under it, "" after.
func floorOf(ctx context.Context) string {
	f, _ := ctx.Value(notOlderThanKey{}).(*floor)
	if f == nil || f.used.Swap(true) {
		return ""
	}
	return f.rv
}

// listFloored runs list with the label selector, not older than the floor
// of ctx when it has one for this read, and consistently when it has none
// or the floored read fails (WithNotOlderThan).
func listFloored[T any](ctx context.Context, selector string, list func(metav1.ListOptions) (T, error)) (T, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if rv := floorOf(ctx); rv != "" {
		floored := opts
		floored.ResourceVersion, floored.ResourceVersionMatch = rv, metav1.ResourceVersionMatchNotOlderThan
		if out, err := list(floored); err == nil {
			return out, nil
		}
	}
	return list(opts)
}

// listed is one list's records and resourceVersion.
type listed struct {
	records []Record
	rv      string
}

// List returns the records in namespace ns ("" for all) that match the
// label selector, and the list's resourceVersion (see WithNotOlderThan).
func (s Store) List(ctx context.Context, ns, selector string) ([]Record, string, error) {
	l, err := listFloored(ctx, selector, func(opts metav1.ListOptions) (listed, error) {
		rs, rv, err := s.list(ctx, opts, ns)
		return listed{rs, rv}, err
	})
	return l.records, l.rv, err
}

func (s Store) list(ctx context.Context, opts metav1.ListOptions, ns string) ([]Record, string, error) {
	if s.kind == KindConfigMap {
		l, err := s.client.CoreV1().ConfigMaps(ns).List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		out := make([]Record, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, FromConfigMap(&l.Items[i]))
		}
		return out, l.ResourceVersion, nil
	}
	l, err := s.client.CoreV1().Secrets(ns).List(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	out := make([]Record, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, FromSecret(&l.Items[i]))
	}
	return out, l.ResourceVersion, nil
}

// Get reads one record.
func (s Store) Get(ctx context.Context, ns, name string) (Record, error) {
	if s.kind == KindConfigMap {
		c, err := s.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Record{}, err
		}
		return FromConfigMap(c), nil
	}
	sec, err := s.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Record{}, err
	}
	return FromSecret(sec), nil
}

// Update writes r's metadata and payload back, conditional on the
// resourceVersion in r.Meta (the one read, unless the caller changed it),
// under fieldManager. Every other field is written as it was read.
func (s Store) Update(ctx context.Context, r Record, fieldManager string) (Record, error) {
	opts := metav1.UpdateOptions{FieldManager: fieldManager}
	switch o := r.obj.(type) {
	case *corev1.Secret:
		upd := o.DeepCopy()
		upd.ObjectMeta = *r.Meta.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string][]byte{}
		}
		upd.Data[DataKey] = r.Payload
		out, err := s.client.CoreV1().Secrets(upd.Namespace).Update(ctx, upd, opts)
		if err != nil {
			return Record{}, err
		}
		return FromSecret(out), nil
	case *corev1.ConfigMap:
		upd := o.DeepCopy()
		upd.ObjectMeta = *r.Meta.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string]string{}
		}
		upd.Data[DataKey] = string(r.Payload)
		out, err := s.client.CoreV1().ConfigMaps(upd.Namespace).Update(ctx, upd, opts)
		if err != nil {
			return Record{}, err
		}
		return FromConfigMap(out), nil
	}
	return Record{}, errors.New("updating a release record that was not read from the API server")
}

// Watch watches the records in ns that match the label selector, from
// resourceVersion rv.
func (s Store) Watch(ctx context.Context, ns, selector, rv string) (watch.Interface, error) {
	opts := metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv}
	if s.kind == KindConfigMap {
		return s.client.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
	}
	return s.client.CoreV1().Secrets(ns).Watch(ctx, opts)
}

// MetadataAccept asks the API server for a list's metadata only
// (PartialObjectMetadataList), with the whole objects as the fallback of a
// server that cannot; MetadataList decodes either.
const MetadataAccept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"

// MetadataList is the part of a list of records read with MetadataAccept.
type MetadataList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []MetadataItem `json:"items"`
}

// MetadataItem is one record of a MetadataList.
type MetadataItem struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

// LabelVersion is helm's label that holds a record's revision number.
const LabelVersion = "version"

// RevisionOf reads the revision number from a record's labels; 0 when it is
// missing or not a number.
func RevisionOf(labels map[string]string) int {
	n, _ := strconv.Atoi(labels[LabelVersion])
	return n
}

// Revision is the record's revision number (see RevisionOf).
func (r Record) Revision() int { return RevisionOf(r.Meta.Labels) }

// Compare orders two records of a release oldest first: by the revision of
// their labels, then by name, so that every reader (the lock's store, the
// write fence) takes the same record for the newest even when a stray copy
// carries the same revision label.
func Compare(aName string, aLabels map[string]string, bName string, bLabels map[string]string) int {
	if c := cmp.Compare(RevisionOf(aLabels), RevisionOf(bLabels)); c != 0 {
		return c
	}
	return strings.Compare(aName, bName)
}

// NewestOf returns the record of the highest revision (see Compare), and
// false when rs is empty.
func NewestOf(rs []Record) (Record, bool) {
	if len(rs) == 0 {
		return Record{}, false
	}
	return slices.MaxFunc(rs, func(a, b Record) int { return Compare(a.Meta.Name, a.Meta.Labels, b.Meta.Name, b.Meta.Labels) }), true
}

// maxNewestAttempts bounds how often Newest lists again because the newest
// record was deleted between the list and the read.
const maxNewestAttempts = 3

// ListMeta returns the metadata of the records in namespace ns ("" for all)
// that match the label selector (Records with Meta and Kind only: no
// payload, and they cannot be updated), and the list's resourceVersion.
// Readers that need only labels, annotations and server-set timestamps (the
// lock commands) use it: release records can be near 1 MiB each.
func (s Store) ListMeta(ctx context.Context, ns, selector string) ([]Record, string, error) {
	rc := s.client.CoreV1().RESTClient()
	if c, ok := rc.(*rest.RESTClient); !ok || c == nil {
		// A client without REST access (a fake clientset): read it all.
		rs, listRV, err := s.List(ctx, ns, selector) // the floor, if any, goes with it
		for i := range rs {
			rs[i] = Record{Kind: rs[i].Kind, Meta: rs[i].Meta}
		}
		return rs, listRV, err
	}
	l, err := listFloored(ctx, selector, func(opts metav1.ListOptions) (MetadataList, error) {
		return s.listMeta(ctx, rc, ns, opts)
	})
	if err != nil {
		return nil, "", err
	}
	out := make([]Record, 0, len(l.Items))
	for _, it := range l.Items {
		out = append(out, Record{Kind: s.kind, Meta: it.Metadata})
	}
	return out, l.Metadata.ResourceVersion, nil
}

func (s Store) listMeta(ctx context.Context, rc rest.Interface, ns string, opts metav1.ListOptions) (MetadataList, error) {
	req := rc.Get().Resource(s.Resource()).
		VersionedParams(&opts, scheme.ParameterCodec).
		SetHeader("Accept", MetadataAccept)
	if ns != "" {
		req = req.Namespace(ns)
	}
	raw, err := req.Do(ctx).Raw()
	if err != nil {
		return MetadataList{}, statusError(raw, err)
	}
	var l MetadataList
	if err := json.Unmarshal(raw, &l); err != nil {
		return MetadataList{}, fmt.Errorf("reading the list of %ss: %w", s.kind, err)
	}
	return l, nil
}

// Newest returns the record of the highest revision among those in ns that
// match selector (false when there is none), and the resourceVersion of the
// list. Only the metadata of the others is read: release records can be
// large, and the lock reads the newest one often.
func (s Store) Newest(ctx context.Context, ns, selector string) (Record, bool, string, error) {
	rc := s.client.CoreV1().RESTClient()
	if c, ok := rc.(*rest.RESTClient); !ok || c == nil {
		// A client without REST access (a fake clientset): read it all.
		rs, listRV, err := s.List(ctx, ns, selector)
		if err != nil {
			return Record{}, false, "", err
		}
		r, ok := NewestOf(rs)
		return r, ok, listRV, nil
	}
	for attempt := 0; ; attempt++ {
		l, err := s.listMeta(ctx, rc, ns, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return Record{}, false, "", err
		}
		if len(l.Items) == 0 {
			return Record{}, false, l.Metadata.ResourceVersion, nil
		}
		best := slices.MaxFunc(l.Items, func(a, b MetadataItem) int {
			return Compare(a.Metadata.Name, a.Metadata.Labels, b.Metadata.Name, b.Metadata.Labels)
		})
		r, err := s.Get(ctx, ns, best.Metadata.Name)
		switch {
		case err == nil:
			return r, true, l.Metadata.ResourceVersion, nil
		case apierrors.IsNotFound(err) && attempt < maxNewestAttempts:
			continue // deleted since the list: list again
		}
		return Record{}, false, "", err
	}
}

// statusError keeps the API server's own answer (a Status: who may not do
// what, where) for an error the REST client could not decode from a
// response to MetadataAccept, which it reports as "unknown".
func statusError(body []byte, err error) error {
	var st metav1.Status
	if json.Unmarshal(body, &st) != nil || st.Kind != "Status" || st.Message == "" {
		return err
	}
	return &apierrors.StatusError{ErrStatus: st}
}
