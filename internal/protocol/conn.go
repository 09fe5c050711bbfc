package protocol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
)

// ErrNoRecords reports a storage driver that keeps no Kubernetes record of
// the release history (sql): there is nothing here to read or recover.
var ErrNoRecords = errors.New("the storage driver keeps no release records in the cluster")

// Conn is one connection to a cluster as the protocol uses it: a client
// whose responses feed an estimate of the API server's clock, helm's release
// records for the storage driver in use, and the cluster access that
// converging an abandoned revision needs. It is safe for concurrent use.
type Conn struct {
	client     kubernetes.Interface
	est        *servertime.Estimator
	clock      clock.Clock
	driver     string
	records    helmx.Records
	recordsErr error
	// sql is helm's sql driver's database (HELM_DRIVER=sql), nil otherwise.
	sql *sqlstore.Store

	// kube builds the cluster access converge needs, once.
	kube       func() (*recovery.Kube, error)
	kubeOnce   sync.Once
	kubeCached *recovery.Kube
	kubeErr    error

	// autoChoice caches BackendAuto's decision per namespace.
	autoChoice sync.Map
	// memory remembers it across processes (RememberAuto); nil does not.
	memory *AutoMemory
	// id identifies the server and credentials (for memory).
	id string
	// seen is what every backend of this connection remembers of the
	// locks it read (lock.Confirm).
	seen *lock.Sightings
	// serverTimeOnly: see JudgeByServerTimeOnly.
	serverTimeOnly bool
}

// Backend makes b one of this connection's lock backends: it shares their
// memory of the locks they read (lock.Sightings), and their judgement. Stores
// calls it; a backend made elsewhere should be passed through it.
func (c *Conn) Backend(b *lock.Backend) *lock.Backend {
	b.Sightings = c.seen
	b.TrustServerTime = c.serverTimeOnly
	return b
}

// JudgeByServerTimeOnly makes this connection's lock backends judge locks
// by server time alone (lock.Backend.TrustServerTime): only for tests whose
// fake clocks stand still. Call it before the first Stores.
func (c *Conn) JudgeByServerTimeOnly() { c.serverTimeOnly = true }

// RememberAuto makes --lock-backend=auto's choice last across processes in
// m (nil: asked once per connection, as before). Call it before the first
// Stores.
func (c *Conn) RememberAuto(m *AutoMemory) {
	if m == nil {
		c.memory = nil
		return
	}
	mm := *m
	mm.id = c.id
	if mm.now == nil {
		mm.now = c.clock.Now
	}
	if mm.TTL <= 0 {
		mm.TTL = DefaultAutoTTL
	}
	c.memory = &mm
}

// ForgetAuto drops auto's choice for ns (the API server refused the backend
// it chose): the next Stores asks again.
func (c *Conn) ForgetAuto(ns string) {
	c.autoChoice.Delete(ns)
	c.memory.forget(ns)
}

// Connect returns a connection to the cluster cfg points at, for helm's
// storage driver helmDriver ("" is secret). cfg itself is not modified. clk
// is the local clock; nil or clock.RealClock stands for sleepclock.System(),
// the real clock that also counts time the machine spends asleep.
func Connect(cfg *rest.Config, clk clock.Clock, helmDriver string) (*Conn, error) {
	return connect(cfg, clk, helmDriver, "")
}

// connect is Connect; with the sql driver, dsn names helm's database ("":
// the one HELM_DRIVER_SQL_CONNECTION_STRING names).
func connect(cfg *rest.Config, clk clock.Clock, helmDriver, dsn string) (*Conn, error) {
	if cfg == nil {
		return nil, errors.New("no REST configuration given")
	}
	if clk == nil || sleepclock.IsReal(clk) {
		clk = sleepclock.System()
	}
	est := servertime.New(clk)
	client, err := kubernetes.NewForConfig(est.Instrument(cfg))
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c := newConn(client, est, clk, helmDriver, dsn, func() (*recovery.Kube, error) { return recovery.NewKube(cfg) })
	c.id = identity(cfg)
	return c, nil
}

// NewConn returns a connection over client, whose responses must feed est
// (servertime.Estimator.Instrument), and clk, the clock est reads. kube
// builds the cluster access converge needs; nil means none (converging a
// revision that has a deployed predecessor then fails, and recovery with
// it: the revision stays pending).
func NewConn(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, helmDriver string, kube func() (*recovery.Kube, error)) *Conn {
	return newConn(client, est, clk, helmDriver, "", kube)
}

func newConn(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, helmDriver, dsn string, kube func() (*recovery.Kube, error)) *Conn {
	c := &Conn{client: client, est: est, clock: clk, driver: helmDriver, kube: kube, seen: lock.NewSightings()}
	if helmDriver == DriverSQL {
		// helm's rows, its lock rows and its trigger live in helm's own
		// database; the lock is still judged in the API server's clock.
		if dsn == "" {
			dsn = os.Getenv(sqlstore.EnvConnectionString)
		}
		c.sql, c.recordsErr = sqlstore.Open(dsn, c.ServerNow)
		if c.sql != nil {
			c.records = c.sql.Records()
		}
	} else {
		c.records, c.recordsErr = helmx.NewRecords(client, helmDriver)
	}
	if c.recordsErr != nil {
		c.recordsErr = fmt.Errorf("%w: %w", ErrNoRecords, c.recordsErr)
	}
	return c
}

// Client is the connection's clientset.
func (c *Conn) Client() kubernetes.Interface { return c.client }

// Estimator is the connection's estimate of the API server's clock.
func (c *Conn) Estimator() *servertime.Estimator { return c.est }

// Clock is the local clock elapsed time is measured with.
func (c *Conn) Clock() clock.Clock { return c.clock }

// Driver is helm's storage driver name ("" is secret).
func (c *Conn) Driver() string { return c.driver }

// DriverSQL is the HELM_DRIVER value of helm's sql storage driver.
const DriverSQL = "sql"

// SQL is the database of helm's sql driver, nil with any other driver.
func (c *Conn) SQL() *sqlstore.Store { return c.sql }

// GateBackend is the lock store every client takes first, beside helm's
// release records: the lock on the records themselves (secret and
// configmap drivers) or the lock row in helm's database (sql). The error
// wraps ErrNoRecords when the driver keeps no record (memory).
func (c *Conn) GateBackend() (*lock.Backend, error) {
	if c.sql != nil {
		return c.Backend(lock.NewBackend(c.client, c.est, c.clock, lock.StoreSQL, c.sql.Locks)), nil
	}
	d, err := records.ParseDriver(c.driver)
	if err != nil {
		return nil, err
	}
	return c.Backend(releasestore.NewBackend(c.client, c.est, c.clock, d)), nil
}

// Records are helm's release records; the error wraps ErrNoRecords when
// the driver keeps none.
func (c *Conn) Records() (helmx.Records, error) { return c.records, c.recordsErr }

// History reads every stored revision of the release, oldest first, with
// their resourceVersions. With a driver that keeps no Kubernetes record it
// returns an error wrapping ErrNoRecords.
func (c *Conn) History(ctx context.Context, ns, release string) ([]helmx.Summary, error) {
	if c.recordsErr != nil {
		return nil, fmt.Errorf("release %q in namespace %q: %w", release, ns, c.recordsErr)
	}
	return helmx.ReadHistory(ctx, c.records, ns, release)
}

// ServerNow returns bounds on the API server's clock, asking the server
// once when nothing has been observed yet.
func (c *Conn) ServerNow(ctx context.Context) (servertime.Bounds, error) {
	if b, ok := c.est.Now(); ok {
		return b, nil
	}
	if err := c.est.Sync(ctx, c.client.Discovery()); err != nil {
		return servertime.Bounds{}, fmt.Errorf("reading the API server's clock: %w", err)
	}
	b, _ := c.est.Now()
	return b, nil
}

func (c *Conn) clusterAccess() (*recovery.Kube, error) {
	c.kubeOnce.Do(func() {
		if c.kube == nil {
			c.kubeErr = errors.New("no cluster access to converge with")
			return
		}
		c.kubeCached, c.kubeErr = c.kube()
	})
	return c.kubeCached, c.kubeErr
}

// RefreshDiscovery forgets the API kinds the cluster access learned, so the
// next recovery sees kinds installed since (a long-running process such as
// the controller; a CLI process is short enough not to need it).
func (c *Conn) RefreshDiscovery() {
	k, err := c.clusterAccess()
	if err != nil || k == nil {
		return
	}
	if r, ok := k.Mapper.(interface{ Reset() }); ok {
		r.Reset()
	}
}
