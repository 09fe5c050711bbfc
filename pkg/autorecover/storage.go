package autorecover

import (
	"errors"
	"fmt"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
)

// Fence is what a fenced storage driver asks before every write: nil means
// the caller still holds its lock. *Lock implements it.
type Fence interface {
	Valid() error
}

// NewFencedDriver returns a helm storage driver that stores releases exactly
// as helm's "secret" driver does (same Secrets, encoding and labels, so
// stock helm 3 and 4 read them), through secrets, a Secrets client of the
// release namespace, and fences every write:
//
//   - Create, Update and Delete ask fence first and, when it reports the lock
//     lost, fail with an error wrapping ErrLost without sending anything.
//   - Update carries the resourceVersion the driver last observed for the
//     record (from a Get, List, Query, Create or Update response), so a
//     record someone else wrote in between makes it fail with an error
//     wrapping ErrConflict (and satisfying apierrors.IsConflict) instead of
//     overwriting them; helm's own driver overwrites blindly. A record never
//     read through the driver is not updated at all.
//   - Delete refuses a record changed since it was read, and is itself
//     conditional on the record's uid and resourceVersion.
//
// Install it with storage.Init, or use FencedStorage.
func NewFencedDriver(secrets corev1client.SecretInterface, fence Fence) (driver.Driver, error) {
	d, err := helmx.NewFencedSecrets(secrets, fence, helmx.FencedOptions{})
	if err != nil {
		return nil, fmt.Errorf("autorecover: %w", err)
	}
	return d, nil
}

// FencedStorage makes cfg store releases through a fenced driver (see
// NewFencedDriver) that checks l before every release write. Call it after
// cfg.Init and before running any action; cfg must be for the namespace of
// the locked release, with helm's "secret" storage (the default). The
// previous storage's MaxHistory is kept. The createdAt and modifiedAt labels
// are stamped from the API server's clock, as estimated by l's Client.
//
// Fencing stops this process from writing once its lock is lost; helm keeps
// running whatever it was doing (waiting, running hooks), so also stop the
// action when Keep reports the loss.
func FencedStorage(cfg *action.Configuration, l *Lock) error {
	if cfg == nil {
		return errors.New("autorecover: fenced storage: no action configuration given")
	}
	if l == nil {
		return errors.New("autorecover: fenced storage: no lock given")
	}
	if cfg.Releases != nil && cfg.Releases.Driver != nil && cfg.Releases.Name() != driver.SecretsDriverName {
		return fmt.Errorf("autorecover: fenced storage: the configuration stores releases with the %q driver; only helm's secret driver can be fenced", cfg.Releases.Name())
	}
	c := l.c
	now := func() time.Time {
		if b, ok := c.est.Now(); ok {
			return b.Latest
		}
		return c.clock.Now()
	}
	d, err := helmx.NewFencedSecrets(c.kube.CoreV1().Secrets(l.namespace), l, helmx.FencedOptions{Now: now})
	if err != nil {
		return fmt.Errorf("autorecover: fenced storage for release %q in namespace %q: %w", l.release, l.namespace, err)
	}
	d.SetLogger(cfg.Logger().Handler())
	s := storage.Init(d)
	if cfg.Releases != nil {
		s.MaxHistory = cfg.Releases.MaxHistory
	}
	cfg.Releases = s
	return nil
}
