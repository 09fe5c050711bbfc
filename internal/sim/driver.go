package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/release"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
)

// secrets is helm's secret driver with its two writes done by the
// simulation: the same Secret, byte for byte (TestSecretsAsHelm), from a
// gzip writer kept for reuse (helmx.EncodeReleaseJSON). Helm's driver makes a new writer per record,
// and its 700 KB of tables were most of the memory a schedule allocated
// and a seventh of its time. Reads and deletes are helm's own.
type secrets struct {
	*driver.Secrets
	impl typedcorev1.SecretInterface
}

// simStorage gives cfg, whose storage Run fenced, the simulation's
// secrets driver over the same fenced client, and returns that client's
// ConfigMaps, for the chart's objects.
func simStorage(cfg *action.Configuration) (typedcorev1.ConfigMapInterface, error) {
	rc, err := cfg.RESTClientGetter.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("sim: the fenced configuration: %w", err)
	}
	core, err := typedcorev1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("sim: the fenced client: %w", err)
	}
	impl := core.Secrets(Namespace)
	d := &secrets{Secrets: driver.NewSecrets(impl), impl: impl}
	d.SetLogger(quiet.Handler())
	s := storage.Init(d)
	s.MaxHistory = cfg.Releases.MaxHistory
	cfg.Releases = s
	return core.ConfigMaps(Namespace), nil
}

// Create stores rel as a new record, as helm's driver does.
func (s *secrets) Create(key string, rel release.Releaser) error {
	obj, err := recordSecret(key, rel, "createdAt")
	if err != nil {
		return fmt.Errorf("create: failed to encode release: %w", err)
	}
	if _, err := s.impl.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return driver.ErrReleaseExists
		}
		return fmt.Errorf("create: failed to create: %w", err)
	}
	return nil
}

// Update rewrites the record of rel, as helm's driver does.
func (s *secrets) Update(key string, rel release.Releaser) error {
	obj, err := recordSecret(key, rel, "modifiedAt")
	if err != nil {
		return fmt.Errorf("update: failed to encode release: %w", err)
	}
	if _, err := s.impl.Update(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: failed to update: %w", err)
	}
	return nil
}

// recordSecret is the Secret helm's driver stores rel in, stamped now under
// the label stamp (createdAt or modifiedAt).
func recordSecret(key string, rel release.Releaser, stamp string) (*corev1.Secret, error) {
	r, ok := rel.(*rspb.Release)
	if !ok {
		return nil, fmt.Errorf("sim: a release of type %T", rel)
	}
	data, err := encodeRecord(r)
	if err != nil {
		return nil, err
	}
	// In helm's order: the release's labels, the stamp, the release's
	// labels again (a stamp the release carries from its last read wins),
	// then helm's own.
	labels := map[string]string{stamp: strconv.FormatInt(time.Now().Unix(), 10)}
	maps.Copy(labels, r.Labels)
	labels["name"], labels["owner"] = r.Name, "helm"
	labels["status"], labels["version"] = r.Info.Status.String(), strconv.Itoa(r.Version)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key, Labels: labels},
		Type:       "helm.sh/release.v1",
		Data:       map[string][]byte{"release": data},
	}, nil
}

// encodeRecord is helm's encoding of a release record: JSON, gzipped at
// the best compression, in base64 (helmx's encoder, with reused writers).
func encodeRecord(r *rspb.Release) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return helmx.EncodeReleaseJSON(b)
}
