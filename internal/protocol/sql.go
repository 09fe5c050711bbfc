package protocol

import (
	"context"
	"errors"
	"fmt"
	"os"

	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
)

// EnvSQLConnectionString is the variable helm's sql driver reads its
// PostgreSQL connection string from.
const EnvSQLConnectionString = sqlstore.EnvConnectionString

// ErrNoSQLSession: helm's connection to its sql database does not name the
// session whose lock fences its writes (CheckSQLSession).
var ErrNoSQLSession = sqlstore.ErrNoSession

// UsesSQL reports whether helm keeps its releases in a sql database
// (HELM_DRIVER=sql) on this connection.
func (c *Conn) UsesSQL() bool { return c.sql != nil }

// CheckSQLSession makes sure helm's connection to its sql database names
// session, whose lock the database's trigger checks helm's writes against
// (NameSQLSession put it there before helm opened the database); nil
// without the sql driver.
func (c *Conn) CheckSQLSession(ctx context.Context, session string) error {
	if c.sql == nil {
		return nil
	}
	return c.sql.CheckSession(ctx, session)
}

// SQLRefused reports whether err is the sql driver's database refusing a
// write of a session that no longer holds the release's lock row.
func SQLRefused(err error) bool { return sqlstore.IsRefused(err) }

// NameSQLSession puts session into helm's sql connection string (the
// environment helm reads it from), so that the database fences helm's
// writes by that session's lock; call it before helm opens the database.
func NameSQLSession(session string) error {
	dsn, err := sqlstore.WithSession(os.Getenv(sqlstore.EnvConnectionString), session)
	if err != nil {
		return fmt.Errorf("HELM_DRIVER=sql: %w", err)
	}
	if err := os.Setenv(sqlstore.EnvConnectionString, dsn); err != nil {
		return fmt.Errorf("HELM_DRIVER=sql: %w", err)
	}
	return nil
}

// ConnectSQL is Connect for helm's sql storage driver, with its database at
// dsn (the PostgreSQL connection string helm takes) rather than the one
// HELM_DRIVER_SQL_CONNECTION_STRING names. The connection keeps one pool to
// the database for the protocol's own reads and writes; Close ends it.
func ConnectSQL(cfg *rest.Config, clk clock.Clock, dsn string) (*Conn, error) {
	if dsn == "" {
		return nil, sqlstore.ErrNoConnectionString
	}
	return connect(cfg, clk, DriverSQL, dsn)
}

// Close ends the connection's pool to the sql driver's database (nothing
// to do with any other driver). Locks taken through the connection must be
// given back first.
func (c *Conn) Close() error {
	if c.sql == nil {
		return nil
	}
	return c.sql.Close()
}

// errNotSQL: HelmSQL on a connection whose driver is not sql.
var errNotSQL = errors.New("helm's sql driver asked for on a connection that does not use it")

// HelmSQL returns helm's own sql storage driver for the lock's release,
// whose connections name the lock's session: the database refuses helm's
// writes through it once the session no longer holds the release's lock
// row. It is opened once per lock and closed when the lock is given back
// (Release, ReleaseAndDelete, End), after helm's statements in flight have
// ended. The doors that run helm in their own process (the Go package)
// store releases through it; the CLI's helm opens its own with the session
// NameSQLSession put into its connection string.
func (l *Lock) HelmSQL(ctx context.Context) (driver.Driver, error) {
	if l.conn.sql == nil {
		return nil, errNotSQL
	}
	l.helmMu.Lock()
	defer l.helmMu.Unlock()
	if l.helmSQL != nil {
		return l.helmSQL, nil
	}
	if l.helmDrained {
		return nil, fmt.Errorf("release %q in namespace %q: helm's sql driver asked for once the lock is being given back: %w", l.release, l.namespace, ErrLost)
	}
	if err := l.held.Valid(); err != nil {
		return nil, err
	}
	h, err := l.conn.sql.OpenHelm(ctx, l.namespace, l.Session())
	if err != nil {
		return nil, fmt.Errorf("release %q in namespace %q: HELM_DRIVER=sql: %w", l.release, l.namespace, err)
	}
	l.helmSQL = h
	return h, nil
}

// PendingSQL lists the releases with a revision in one of statuses in the
// sql driver's database, in namespaces (all when empty): what a controller
// of a sql-backed cluster polls, as it watches records otherwise.
func (c *Conn) PendingSQL(ctx context.Context, namespaces, statuses []string) ([]types.NamespacedName, error) {
	if c.sql == nil {
		return nil, errNotSQL
	}
	return c.sql.Pending(ctx, namespaces, statuses)
}
