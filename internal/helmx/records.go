package helmx

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// The kinds of object helm's Kubernetes storage drivers keep revisions in.
const (
	KindSecret    = "Secret"
	KindConfigMap = "ConfigMap"
)

// Record is one stored release revision as helm's "secret" or "configmap"
// storage driver keeps it: the same labels on both, and the same encoded
// release in data["release"] (Secret data or ConfigMap data).
type Record struct {
	// Kind is KindSecret or KindConfigMap.
	Kind string
	Meta metav1.ObjectMeta
	// Payload is data["release"] as stored: base64 text of the gzipped JSON.
	Payload []byte
	// secretType is the Secret's type (Secrets only).
	secretType corev1.SecretType
	// obj is the object read, kept so that an update rewrites only what
	// the caller changed.
	obj any
}

// SecretRecord views a release Secret as a Record.
func SecretRecord(s *corev1.Secret) Record {
	return Record{Kind: KindSecret, Meta: s.ObjectMeta, Payload: s.Data[ReleaseDataKey], secretType: s.Type, obj: s}
}

// ConfigMapRecord views a release ConfigMap as a Record.
func ConfigMapRecord(c *corev1.ConfigMap) Record {
	var payload []byte
	if v, ok := c.Data[ReleaseDataKey]; ok {
		payload = []byte(v)
	}
	return Record{Kind: KindConfigMap, Meta: c.ObjectMeta, Payload: payload, obj: c}
}

// hasPayload reports whether the record has a data["release"] key at all.
func (r Record) hasPayload() bool {
	switch o := r.obj.(type) {
	case *corev1.Secret:
		_, ok := o.Data[ReleaseDataKey]
		return ok
	case *corev1.ConfigMap:
		_, ok := o.Data[ReleaseDataKey]
		return ok
	}
	return r.Payload != nil
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

// Records reads and writes helm's release records of one storage driver.
type Records struct {
	client kubernetes.Interface
	kind   string
}

// NewRecords returns the records of helmDriver (HELM_DRIVER: "" and
// "secret(s)" are Secrets, "configmap(s)" ConfigMaps). The sql and memory
// drivers keep no Kubernetes record: the error wraps lock.ErrNoReleaseRecords.
func NewRecords(client kubernetes.Interface, helmDriver string) (Records, error) {
	d, err := lock.ParseDriver(helmDriver)
	if err != nil {
		return Records{}, err
	}
	if d == lock.DriverConfigMap {
		return Records{client: client, kind: KindConfigMap}, nil
	}
	return Records{client: client, kind: KindSecret}, nil
}

// SecretRecords returns the records of helm's default "secret" driver.
func SecretRecords(client kubernetes.Interface) Records {
	return Records{client: client, kind: KindSecret}
}

// Kind is KindSecret or KindConfigMap.
func (s Records) Kind() string { return s.kind }

// Resource is the API resource of the records ("secrets" or "configmaps").
func (s Records) Resource() string {
	if s.kind == KindConfigMap {
		return "configmaps"
	}
	return "secrets"
}

// Kubectl is how a person reads one of these records: "kubectl get secret".
func (s Records) Kubectl() string {
	if s.kind == KindConfigMap {
		return "kubectl get configmap"
	}
	return "kubectl get secret"
}

// List returns the records in namespace ns ("" for all) that match selector.
func (s Records) List(ctx context.Context, ns, selector string) ([]Record, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if s.kind == KindConfigMap {
		l, err := s.client.CoreV1().ConfigMaps(ns).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out := make([]Record, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, ConfigMapRecord(&l.Items[i]))
		}
		return out, nil
	}
	l, err := s.client.CoreV1().Secrets(ns).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make([]Record, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, SecretRecord(&l.Items[i]))
	}
	return out, nil
}

// Get reads one record.
func (s Records) Get(ctx context.Context, ns, name string) (Record, error) {
	if s.kind == KindConfigMap {
		c, err := s.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Record{}, err
		}
		return ConfigMapRecord(c), nil
	}
	sec, err := s.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Record{}, err
	}
	return SecretRecord(sec), nil
}

// Update writes r's payload and labels back, conditional on the
// resourceVersion in r.Meta (the one read, unless the caller changed it).
// Annotations and every other field are written as they were read.
func (s Records) Update(ctx context.Context, r Record, fieldManager string) (Record, error) {
	opts := metav1.UpdateOptions{FieldManager: fieldManager}
	switch o := r.obj.(type) {
	case *corev1.Secret:
		upd := o.DeepCopy()
		upd.ObjectMeta = *r.Meta.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string][]byte{}
		}
		upd.Data[ReleaseDataKey] = r.Payload
		out, err := s.client.CoreV1().Secrets(upd.Namespace).Update(ctx, upd, opts)
		if err != nil {
			return Record{}, err
		}
		return SecretRecord(out), nil
	case *corev1.ConfigMap:
		upd := o.DeepCopy()
		upd.ObjectMeta = *r.Meta.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string]string{}
		}
		upd.Data[ReleaseDataKey] = string(r.Payload)
		out, err := s.client.CoreV1().ConfigMaps(upd.Namespace).Update(ctx, upd, opts)
		if err != nil {
			return Record{}, err
		}
		return ConfigMapRecord(out), nil
	}
	return Record{}, errors.New("updating a release record that was not read from the API server")
}

// Secret returns the Secret the record was read as or written to, nil for a
// ConfigMap.
func (r Record) Secret() *corev1.Secret {
	s, _ := r.obj.(*corev1.Secret)
	return s
}
