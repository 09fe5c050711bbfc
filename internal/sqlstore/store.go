// Package sqlstore keeps helm-autorecover's protocol in the PostgreSQL
// database of helm's sql storage driver (HELM_DRIVER=sql), beside helm's
// own table of releases (releases_v1):
//
//   - a lock row per release (table helm_autorecover_locks_v1), holding its
//     lock record, its waiters' queue and the session that holds it,
//     written by compare-and-swap on its version (Locks, a lock.Store);
//   - a trigger on releases_v1 that refuses any write (insert, update,
//     delete) made on a connection that names a lock session
//     (helm_autorecover.session, put there by WithSession or by Update)
//     when that session does not hold the release's lock row. The trigger
//     takes a share lock on the row, so a taker's write of the row waits
//     for a holder's write in flight, and a holder's write after the take
//     is refused: helm's own writes are fenced by the database;
//   - a side table (helm_autorecover_writes_v1) in which the trigger notes,
//     per release row, the session that last wrote it and when, in the
//     database's clock: recovery attributes a pending revision to the
//     holder that wrote it, and measures its age in the database's clock.
//
// Records reads helm's rows as release records (helmx.Records), so that the
// one recovery procedure (package protocol) reads, judges and marks them
// failed, with writes conditional on the row's content.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"

	_ "github.com/lib/pq" // helm's sql driver speaks to PostgreSQL through it

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// EnvConnectionString is the variable helm's sql driver reads its
// connection string from.
const EnvConnectionString = "HELM_DRIVER_SQL_CONNECTION_STRING"

// ErrNoConnectionString: HELM_DRIVER=sql with no connection string.
var ErrNoConnectionString = errors.New("HELM_DRIVER=sql needs " + EnvConnectionString + " (the PostgreSQL connection string helm uses)")

// Store is one database of helm's sql driver. It is safe for concurrent
// use; the connection is opened on first use.
type Store struct {
	db *sql.DB
	// dsn is the connection string the store was opened with: helm's own
	// driver is opened with it, naming a lock session (OpenHelm).
	dsn string
	// now bounds the API server's clock: a row's age, measured in the
	// database's clock, is placed on it.
	now func(context.Context) (servertime.Bounds, error)

	schemaMu sync.Mutex
	// schemaOK: tables and triggers are in place; tablesMade: the tables
	// are, while helm's own table does not exist yet.
	schemaOK, tablesMade bool
	names                names
	// connSession is the lock session the store's connections name, as
	// the last schema query read it.
	connSession string
}

// Open returns the store of the database at dsn (a lib/pq connection
// string, as helm takes it). now bounds the API server's clock (the
// protocol's Conn.ServerNow). No connection is made until the first use.
func Open(dsn string, now func(context.Context) (servertime.Bounds, error)) (*Store, error) {
	if dsn == "" {
		return nil, ErrNoConnectionString
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening the sql driver's database: %w", err)
	}
	db.SetMaxIdleConns(2)
	return &Store{db: db, dsn: dsn, now: now}, nil
}

// FromEnv opens the database helm's sql driver uses
// (HELM_DRIVER_SQL_CONNECTION_STRING).
func FromEnv(now func(context.Context) (servertime.Bounds, error)) (*Store, error) {
	return Open(os.Getenv(EnvConnectionString), now)
}

// DB is the store's database handle.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the store's connections.
func (s *Store) Close() error { return s.db.Close() }
