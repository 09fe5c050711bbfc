package helmx

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// Records and Record are package records' store and record, named here for
// the readers of release history.
type (
	Records = records.Store
	Record  = records.Record
)

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
