package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unsafe"

	"helm.sh/helm/v4/pkg/storage/driver"
)

// HelmDriver is helm's own sql storage driver opened for one lock session:
// every connection of its pool names the session, so the database's trigger
// refuses helm's writes through it once the session no longer holds the
// release's lock row. Close ends its pool.
type HelmDriver struct {
	*driver.SQL
	db helmDB
}

// helmDB is the part of helm's connection pool (an *sqlx.DB, which helm's
// driver keeps to itself) the store uses.
type helmDB interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	Close() error
}

// errHelmPool: a version of helm's sql driver that no longer keeps its pool
// where OpenHelm finds it; the pool could not be closed, so it is not used.
var errHelmPool = errors.New("helm's sql driver keeps its connection pool out of reach (a newer helm?): helm-autorecover cannot close it, and refuses to leak one pool per operation")

// OpenHelm opens helm's own sql storage driver for namespace ns on this
// store's database, with session put into its connection string
// (WithSession), and checks that the session reached PostgreSQL (a service
// file or a pooler may drop the options, which would leave helm's writes
// unfenced). helm's driver opens a pool of its own per driver and has no
// way to close it; Close reaches it so that a long-running process does not
// leave one pool per operation behind. The schema of EnsureSchema is put in
// place once helm's own migrations have run.
func (s *Store) OpenHelm(ctx context.Context, ns, session string) (*HelmDriver, error) {
	dsn, err := WithSession(s.dsn, session)
	if err != nil {
		return nil, err
	}
	d, err := driver.NewSQL(dsn, ns)
	if err != nil {
		return nil, fmt.Errorf("opening helm's sql driver: %w", err)
	}
	db, err := helmPool(d)
	if err != nil {
		return nil, err
	}
	h := &HelmDriver{SQL: d, db: db}
	var got string
	if err := db.QueryRowContext(ctx, `SELECT coalesce(current_setting('`+settingSession+`', true), '')`).Scan(&got); err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("reading the lock session of helm's sql connection: %w", err)
	}
	if got != session {
		_ = h.Close()
		return nil, fmt.Errorf("%w (it reads %q): the connection string's options (-c %s=...) did not reach PostgreSQL, as with a service file that sets options or a pooler that drops them, so helm's writes could not be fenced; connect to PostgreSQL directly, without options in a service file",
			ErrNoSession, strings.TrimSpace(got), settingSession)
	}
	if err := s.EnsureSchema(ctx); err != nil {
		_ = h.Close()
		return nil, err
	}
	return h, nil
}

// Close closes helm's connection pool, after the statements in flight on it
// have ended (database/sql's Close waits for them): no write of helm's
// through it can land afterwards.
func (h *HelmDriver) Close() error { return h.db.Close() }

// helmPool reaches the connection pool helm's sql driver keeps in its
// unexported field db.
func helmPool(d *driver.SQL) (helmDB, error) {
	f := reflect.ValueOf(d).Elem().FieldByName("db")
	if !f.IsValid() || f.Kind() != reflect.Pointer || f.IsNil() {
		return nil, errHelmPool
	}
	v := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface() //nolint:gosec // the one way to close helm's pool
	db, ok := v.(helmDB)
	if !ok {
		return nil, errHelmPool
	}
	return db, nil
}
