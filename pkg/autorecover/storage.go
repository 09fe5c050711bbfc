package autorecover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// fencedConfig is the client's REST configuration with every request going
// through this lock's write fence: the same fence the helm-autorecover CLI
// puts on helm's own clients.
//
//   - Every write (POST, PUT, PATCH, DELETE) first asks Valid; once the lock
//     is lost or released the request is not sent and fails with an error
//     wrapping ErrLost.
//   - helm's create of the release's next revision record carries the lock
//     record: the pending revision and its lock are one atomic write.
//   - helm's update of a release record (a blind overwrite in helm's own
//     driver) becomes conditional on the resourceVersion read, and is
//     refused when another session's lock is on the record.
func (l *Lock) fencedConfig() *rest.Config {
	return l.fence.Wrap(l.c.conn.Estimator().Instrument(l.c.config))
}

// ActionConfig returns a helm action configuration for the locked release's
// namespace whose every Kubernetes request, release records and applied
// objects alike, goes through the lock's write fence (see FencedStorage),
// with the client's storage driver. With the sql driver, releases are
// stored through helm's own sql driver over connections that name the
// lock's session: the database refuses its writes once the lock is lost,
// and its pool is closed when the lock is given back. Run hands one to its
// operation.
func (l *Lock) ActionConfig() (*action.Configuration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sqlOpenTimeout)
	defer cancel()
	cfg, err := l.held.HelmConfig(ctx, &fencedGetter{config: l.fencedConfig(), namespace: l.namespace})
	if err != nil {
		return nil, fmt.Errorf("autorecover: %w", err)
	}
	return cfg, nil
}

// FencedStorage makes cfg store releases through helm's own storage driver
// (the client's: secret or configmap) over a client whose requests go
// through the lock's write fence: no release write leaves once the lock is
// lost, the pending revision is created carrying the lock, and rewrites are
// conditional on the resourceVersion read. With the sql driver, through
// helm's sql driver opened for the lock's session (see ActionConfig). Call it after cfg.Init and
// before running any action; cfg must be for the namespace of the locked
// release. The previous storage's MaxHistory is kept.
//
// Only the release records are fenced this way; the objects helm applies go
// through cfg's own clients, so also stop the action when Keep reports the
// loss. ActionConfig fences both.
func FencedStorage(cfg *action.Configuration, l *Lock) error {
	if cfg == nil {
		return errors.New("autorecover: fenced storage: no action configuration given")
	}
	if l == nil {
		return errors.New("autorecover: fenced storage: no lock given")
	}
	if l.c.conn.UsesSQL() {
		// The database fences helm's writes: its trigger refuses those of
		// a session that no longer holds the release's lock row.
		ctx, cancel := context.WithTimeout(context.Background(), sqlOpenTimeout)
		defer cancel()
		if err := l.held.StoreWithHelmSQL(ctx, cfg); err != nil {
			return fmt.Errorf("autorecover: fenced storage: %w", err)
		}
		return nil
	}
	cs, err := kubernetes.NewForConfig(l.fencedConfig())
	if err != nil {
		return fmt.Errorf("autorecover: fenced storage for release %q in namespace %q: %w", l.release, l.namespace, err)
	}
	var d driver.Driver
	switch name := l.c.conn.Driver(); name {
	case "", "secret", "secrets":
		if cfg.Releases != nil && cfg.Releases.Driver != nil && cfg.Releases.Name() != driver.SecretsDriverName {
			return fmt.Errorf("autorecover: fenced storage: the configuration stores releases with the %q driver, the client with helm's secret driver", cfg.Releases.Name())
		}
		s := driver.NewSecrets(cs.CoreV1().Secrets(l.namespace))
		s.SetLogger(cfg.Logger().Handler())
		d = s
	default:
		if cfg.Releases != nil && cfg.Releases.Driver != nil && cfg.Releases.Name() != driver.ConfigMapsDriverName {
			return fmt.Errorf("autorecover: fenced storage: the configuration stores releases with the %q driver, the client with helm's configmap driver", cfg.Releases.Name())
		}
		c := driver.NewConfigMaps(cs.CoreV1().ConfigMaps(l.namespace))
		c.SetLogger(cfg.Logger().Handler())
		d = c
	}
	s := storage.Init(d)
	if cfg.Releases != nil {
		s.MaxHistory = cfg.Releases.MaxHistory
	}
	cfg.Releases = s
	return nil
}

// sqlOpenTimeout bounds opening helm's sql driver for a lock (a connection,
// helm's migrations, one query).
const sqlOpenTimeout = 30 * time.Second

// fencedGetter hands helm the fenced REST configuration, and one cached
// discovery client and mapper over it.
type fencedGetter struct {
	config    *rest.Config
	namespace string

	once   sync.Once
	dc     discovery.CachedDiscoveryInterface
	mapper meta.RESTMapper
	err    error
}

func (g *fencedGetter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.config), nil }

func (g *fencedGetter) discovery() {
	g.once.Do(func() {
		dc, err := discovery.NewDiscoveryClientForConfig(g.config)
		if err != nil {
			g.err = err
			return
		}
		g.dc = memory.NewMemCacheClient(dc)
		g.mapper = restmapper.NewDeferredDiscoveryRESTMapper(g.dc)
	})
}

func (g *fencedGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	g.discovery()
	return g.dc, g.err
}

func (g *fencedGetter) ToRESTMapper() (meta.RESTMapper, error) {
	g.discovery()
	return g.mapper, g.err
}

func (g *fencedGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewDefaultClientConfig(clientcmdapi.Config{}, &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}
