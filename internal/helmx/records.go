package helmx

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// Record is package records' record, named here for the readers of release
// history.
type Record = records.Record

// Records is a store of helm's release records: the Kubernetes Secrets or
// ConfigMaps of package records (records.Store), or the rows of helm's sql
// driver (package sqlstore). Every Update is conditional on the
// resourceVersion the record was read at.
type Records interface {
	// Kind names what one record is, for messages (Secret, ConfigMap, SQL
	// row).
	Kind() string
	// Resource is the Kubernetes resource the records are kept in
	// ("secrets", "configmaps"), empty when they are not in Kubernetes.
	Resource() string
	// ReadCommand is the command a person runs to read record name in ns.
	ReadCommand(ns, name string) string
	List(ctx context.Context, ns, selector string) ([]Record, string, error)
	ListMeta(ctx context.Context, ns, selector string) ([]Record, string, error)
	Get(ctx context.Context, ns, name string) (Record, error)
	// Newest returns the record of the highest revision among those that
	// match selector (false when there is none), and the list's version.
	Newest(ctx context.Context, ns, selector string) (Record, bool, string, error)
	// Update writes r back, conditional on r.Meta.ResourceVersion. A store
	// that fences its writes (WriteFenced) writes as the session
	// WithWriter put in ctx, and refuses when there is none.
	Update(ctx context.Context, r Record, fieldManager string) (Record, error)
	// WriteFenced reports whether the store itself refuses a write made
	// for a session that does not hold the release's lock (the sql
	// driver's trigger), so that its writers need not check the lock a
	// record carries.
	WriteFenced() bool
}

// writerKey carries, in a context, the lock session a write is made for.
type writerKey struct{}

// WithWriter returns ctx for writes made under the lock of session: a
// store that fences its writes (Records.WriteFenced) makes them as it.
func WithWriter(ctx context.Context, session string) context.Context {
	return context.WithValue(ctx, writerKey{}, session)
}

// WriterOf returns the session WithWriter put in ctx, "" when none.
func WriterOf(ctx context.Context) string {
	s, _ := ctx.Value(writerKey{}).(string)
	return s
}

// The kinds of object helm's Kubernetes storage drivers keep revisions in.
const (
	KindSecret    = records.KindSecret
	KindConfigMap = records.KindConfigMap
)

// NewRecords returns the records of helmDriver (HELM_DRIVER: "" and
// "secret(s)" are Secrets, "configmap(s)" ConfigMaps). The sql and memory
// drivers keep no Kubernetes record: the error wraps
// records.ErrNoReleaseRecords.
func NewRecords(client kubernetes.Interface, helmDriver string) (Records, error) {
	return records.ForHelmDriver(client, helmDriver)
}

// SecretRecords returns the records of helm's default "secret" driver.
func SecretRecords(client kubernetes.Interface) Records {
	return records.New(client, records.DriverSecret)
}

// SecretRecord views a release Secret as a Record.
func SecretRecord(s *corev1.Secret) Record { return records.FromSecret(s) }
