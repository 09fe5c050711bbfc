package protocol

import (
	"context"
	"fmt"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/storage"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// HelmConfig returns helm's action configuration for the lock's release,
// over getter's clients (the door fences them: helmx.WriteFence.Getter),
// storing releases with the connection's driver: with sql, through helm's
// own driver opened for this lock's session (HelmSQL), so that the
// database refuses its writes once the lock is lost; with secret or
// configmap, through getter's clients. Objects without a namespace go to
// the release's, whatever namespace getter's configuration names.
func (l *Lock) HelmConfig(ctx context.Context, getter genericclioptions.RESTClientGetter) (*action.Configuration, error) {
	cfg := action.NewConfiguration()
	drv := l.conn.driver
	if l.conn.sql != nil {
		// Initialised as for Secrets (nothing is opened), then stored
		// through HelmSQL: cfg.Init would open helm's driver from the
		// environment, naming no session.
		drv = "secret"
	}
	if err := cfg.Init(getter, l.namespace, drv); err != nil {
		return nil, fmt.Errorf("helm configuration for release %q in namespace %q: %w", l.release, l.namespace, err)
	}
	if kc, ok := cfg.KubeClient.(*kube.Client); ok {
		kc.Namespace = l.namespace
	}
	if l.conn.sql != nil {
		if err := l.StoreWithHelmSQL(ctx, cfg); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// StoreWithHelmSQL makes cfg store releases through HelmSQL, keeping its
// storage's MaxHistory.
func (l *Lock) StoreWithHelmSQL(ctx context.Context, cfg *action.Configuration) error {
	d, err := l.HelmSQL(ctx)
	if err != nil {
		return err
	}
	s := storage.Init(d)
	if cfg.Releases != nil {
		s.MaxHistory = cfg.Releases.MaxHistory
	}
	cfg.Releases = s
	return nil
}
