package helmx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/release"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

var (
	// ErrConflict: a release record changed (or vanished) after this driver
	// last read it, so the write was refused instead of overwriting the other
	// writer. Read the release again and decide again; never retry the same
	// write. When the API server itself refused the write, the error also
	// satisfies apierrors.IsConflict.
	ErrConflict = errors.New("release record changed since it was read")
	// ErrNotObserved: Update or Delete was asked for a record this driver
	// has not read, so it has no resourceVersion to make the write
	// conditional on. Read it through the driver first.
	ErrNotObserved = errors.New("release record was not read through the fenced driver")
)

// Fence is what the fenced driver asks before every write: nil means the
// caller still holds its lock and may write. *lock.Held implements it.
type Fence interface {
	Valid() error
}

// FencedOptions tune a FencedSecrets. The zero value is usable.
type FencedOptions struct {
	// Now stamps the createdAt and modifiedAt labels (Unix seconds, as helm
	// writes them). It defaults to the local clock, as in helm; pass an
	// estimate of the API server's clock to keep those labels in one clock.
	Now func() time.Time
	// FieldManager names the writer in managedFields; empty lets the API
	// server derive it from the user agent, as for helm's own driver.
	FieldManager string
}

// FencedSecrets is a helm storage driver (driver.Driver) that stores
// releases exactly as helm's "secret" driver does, and fences every write:
//
//   - Create, Update and Delete first ask the Fence; when it says the lock is
//     no longer held they return its error (wrapping lock.ErrLost) and send
//     nothing to the API server.
//   - Update is a compare-and-swap: it carries the resourceVersion this
//     driver last observed for the record (from a Get, List, Query, Create
//     or Update response), so a record another writer changed in between
//     makes it fail with ErrConflict. Helm's own driver sends no
//     resourceVersion: the last writer wins.
//   - Delete is conditional the same way (uid and resourceVersion
//     preconditions), and refuses a record that changed since it was read.
//
// Reads are helm's own: they go through driver.Secrets over a Secrets
// client that records what each response says about resourceVersions.
//
// The layout is helm's: a Secret of type helm.sh/release.v1 per revision,
// named sh.helm.release.v1.<name>.v<revision>, data["release"] holding
// base64(gzip(JSON of the release)), the release's custom labels plus the
// system labels name, owner=helm, status, version, createdAt (on Create) and
// modifiedAt (on Update). Unlike helm's Update, which rebuilds the Secret,
// Update keeps the createdAt label and the annotations of the record it
// replaces.
type FencedSecrets struct {
	secrets corev1client.SecretInterface
	stock   *driver.Secrets
	fence   Fence
	opts    FencedOptions

	mu   sync.Mutex
	seen map[string]observed
}

// observed is what the last response said about one record.
type observed struct {
	resourceVersion string
	uid             types.UID
	createdAt       string
	annotations     map[string]string
}

var _ driver.Driver = (*FencedSecrets)(nil)

// NewFencedSecrets returns a fenced driver over secrets (a Secrets client of
// the release namespace) that asks fence before every write.
func NewFencedSecrets(secrets corev1client.SecretInterface, fence Fence, opts FencedOptions) (*FencedSecrets, error) {
	if secrets == nil {
		return nil, errors.New("fenced release storage: no Secrets client given")
	}
	if fence == nil {
		return nil, errors.New("fenced release storage: no fence given; every write needs a lock to check")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := &FencedSecrets{secrets: secrets, fence: fence, opts: opts, seen: map[string]observed{}}
	d.stock = driver.NewSecrets(&observingSecrets{SecretInterface: secrets, d: d})
	return d, nil
}

// Name is helm's name for the secret driver, so nothing keyed on the
// driver's name behaves differently.
func (d *FencedSecrets) Name() string { return driver.SecretsDriverName }

// Logger and SetLogger let helm's storage.Init and action.Configuration
// share their logger with the driver, as with helm's own drivers.
func (d *FencedSecrets) Logger() *slog.Logger { return d.stock.Logger() }

// SetLogger sets the logger of the reads.
func (d *FencedSecrets) SetLogger(h slog.Handler) { d.stock.SetLogger(h) }

// Get reads one record; its resourceVersion is remembered.
func (d *FencedSecrets) Get(key string) (release.Releaser, error) { return d.stock.Get(key) }

// List reads every helm record of the namespace that filter accepts; the
// resourceVersion of every record read is remembered.
func (d *FencedSecrets) List(filter func(release.Releaser) bool) ([]release.Releaser, error) {
	return d.stock.List(filter)
}

// Query reads the records carrying labels; their resourceVersions are
// remembered.
func (d *FencedSecrets) Query(labels map[string]string) ([]release.Releaser, error) {
	return d.stock.Query(labels)
}

// Create stores a new record. It fails with driver.ErrReleaseExists when the
// record exists already, as helm's driver does.
func (d *FencedSecrets) Create(key string, rls release.Releaser) error {
	r, err := asV1(rls)
	if err != nil {
		return err
	}
	if err := d.check("create", key); err != nil {
		return err
	}
	labels := d.labels(r)
	labels[LabelCreatedAt] = d.stampNow()
	obj, err := newRecordSecret(key, r, labels)
	if err != nil {
		return err
	}
	created, err := d.secrets.Create(context.Background(), obj, metav1.CreateOptions{FieldManager: d.opts.FieldManager})
	if apierrors.IsAlreadyExists(err) {
		return driver.ErrReleaseExists
	}
	if err != nil {
		return fmt.Errorf("fenced release storage: create %s: %w", key, err)
	}
	d.observe(created)
	return nil
}

// Update replaces a record, conditional on the resourceVersion this driver
// last observed for it.
func (d *FencedSecrets) Update(key string, rls release.Releaser) error {
	r, err := asV1(rls)
	if err != nil {
		return err
	}
	if err := d.check("update", key); err != nil {
		return err
	}
	prev, ok := d.observed(key)
	if !ok {
		return fmt.Errorf("fenced release storage: update %s: no resourceVersion known for it, and a blind overwrite could undo a concurrent writer; read it first: %w", key, ErrNotObserved)
	}
	labels := d.labels(r)
	if prev.createdAt != "" {
		labels[LabelCreatedAt] = prev.createdAt
	}
	labels[LabelModifiedAt] = d.stampNow()
	obj, err := newRecordSecret(key, r, labels)
	if err != nil {
		return err
	}
	obj.ResourceVersion = prev.resourceVersion
	obj.Annotations = maps.Clone(prev.annotations)
	updated, err := d.secrets.Update(context.Background(), obj, metav1.UpdateOptions{FieldManager: d.opts.FieldManager})
	switch {
	case err == nil:
		d.observe(updated)
		return nil
	case apierrors.IsConflict(err):
		// The observation is kept: every later write based on it must fail
		// the same way until the caller reads the record again.
		return fmt.Errorf("fenced release storage: update %s: someone wrote it after it was read at resourceVersion %s: %w: %w", key, prev.resourceVersion, ErrConflict, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("fenced release storage: update %s: someone deleted it after it was read: %w: %w", key, ErrConflict, driver.ErrReleaseNotFound)
	}
	return fmt.Errorf("fenced release storage: update %s: %w", key, err)
}

// Delete removes a record and returns the release it held. It refuses when
// the record changed since this driver last read it, and the delete itself
// is conditional on the record's uid and resourceVersion.
func (d *FencedSecrets) Delete(key string) (release.Releaser, error) {
	if err := d.check("delete", key); err != nil {
		return nil, err
	}
	prev, hadPrev := d.observed(key)
	rls, err := d.stock.Get(key)
	if err != nil {
		return nil, err
	}
	cur, ok := d.observed(key)
	if !ok {
		return nil, fmt.Errorf("fenced release storage: delete %s: the server returned no resourceVersion: %w", key, ErrConflict)
	}
	if hadPrev && prev.resourceVersion != cur.resourceVersion {
		return nil, fmt.Errorf("fenced release storage: delete %s: it changed since it was read (resourceVersion %s, now %s): %w", key, prev.resourceVersion, cur.resourceVersion, ErrConflict)
	}
	pre := &metav1.Preconditions{ResourceVersion: &cur.resourceVersion}
	if cur.uid != "" {
		pre.UID = &cur.uid
	}
	err = d.secrets.Delete(context.Background(), key, metav1.DeleteOptions{Preconditions: pre})
	switch {
	case err == nil:
		d.forget(key)
		return rls, nil
	case apierrors.IsConflict(err):
		return nil, fmt.Errorf("fenced release storage: delete %s: someone wrote it after it was read at resourceVersion %s: %w: %w", key, cur.resourceVersion, ErrConflict, err)
	case apierrors.IsNotFound(err):
		d.forget(key)
		return nil, driver.ErrReleaseNotFound
	}
	return nil, fmt.Errorf("fenced release storage: delete %s: %w", key, err)
}

// check asks the fence. Its error always satisfies errors.Is(err,
// lock.ErrLost), whatever the fence returned.
func (d *FencedSecrets) check(op, key string) error {
	err := d.fence.Valid()
	if err == nil {
		return nil
	}
	if errors.Is(err, lock.ErrLost) {
		return fmt.Errorf("fenced release storage: refusing to %s %s: %w", op, key, err)
	}
	return fmt.Errorf("fenced release storage: refusing to %s %s: %w: %w", op, key, lock.ErrLost, err)
}

func (d *FencedSecrets) stampNow() string {
	return strconv.FormatInt(d.opts.Now().Unix(), 10)
}

// labels are the release's custom labels (system labels a listed release
// carries are dropped and set afresh) plus the system labels every write
// sets.
func (d *FencedSecrets) labels(r *rspb.Release) map[string]string {
	out := make(map[string]string, len(r.Labels)+6)
	for k, v := range r.Labels {
		out[k] = v
	}
	for _, k := range driver.GetSystemLabels() {
		delete(out, k)
	}
	out[LabelName] = r.Name
	out[LabelOwner] = OwnerHelm
	out[LabelStatus] = r.Info.Status.String()
	out[LabelVersion] = strconv.Itoa(r.Version)
	return out
}

func newRecordSecret(key string, r *rspb.Release, labels map[string]string) (*corev1.Secret, error) {
	doc, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("fenced release storage: encode %s: %w", key, err)
	}
	payload, err := EncodeReleaseJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("fenced release storage: encode %s: %w", key, err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key, Labels: labels},
		Type:       ReleaseSecretType,
		Data:       map[string][]byte{ReleaseDataKey: payload},
	}, nil
}

// asV1 accepts the release types helm's own secret driver accepts.
func asV1(rls release.Releaser) (*rspb.Release, error) {
	switch r := rls.(type) {
	case *rspb.Release:
		if r != nil && r.Info != nil {
			return r, nil
		}
	case rspb.Release:
		if r.Info != nil {
			return &r, nil
		}
	default:
		return nil, fmt.Errorf("fenced release storage: unsupported release type %T", rls)
	}
	return nil, errors.New("fenced release storage: release without info")
}

func (d *FencedSecrets) observe(s *corev1.Secret) {
	if s == nil || s.Name == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.ResourceVersion == "" {
		delete(d.seen, s.Name)
		return
	}
	d.seen[s.Name] = observed{
		resourceVersion: s.ResourceVersion,
		uid:             s.UID,
		createdAt:       s.Labels[LabelCreatedAt],
		annotations:     maps.Clone(s.Annotations),
	}
}

func (d *FencedSecrets) observed(key string) (observed, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.seen[key]
	return o, ok
}

func (d *FencedSecrets) forget(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.seen, key)
}

// observingSecrets is the Secrets client helm's reads go through: it
// remembers the resourceVersion of every record a response carries.
type observingSecrets struct {
	corev1client.SecretInterface
	d *FencedSecrets
}

func (o *observingSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	s, err := o.SecretInterface.Get(ctx, name, opts)
	switch {
	case err == nil:
		o.d.observe(s)
	case apierrors.IsNotFound(err):
		o.d.forget(name)
	}
	return s, err
}

func (o *observingSecrets) List(ctx context.Context, opts metav1.ListOptions) (*corev1.SecretList, error) {
	l, err := o.SecretInterface.List(ctx, opts)
	if err == nil {
		for i := range l.Items {
			o.d.observe(&l.Items[i])
		}
	}
	return l, err
}
