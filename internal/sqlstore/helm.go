package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
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
	Stats() sql.DBStats
}

// errHelmPool: a version of helm's sql driver that no longer keeps its pool
// where OpenHelm finds it.
var errHelmPool = errors.New("helm's sql driver of this build keeps its connection pool out of reach, so helm-autorecover could not close it and refuses to open one per operation: use a helm-autorecover release built with the helm SDK it was tested with (the guarded CLI commands, whose helm opens its own driver, are not affected)")

// helmConnectTimeout bounds the connection of helm's driver (lib/pq's
// connect_timeout, in seconds) when the connection string sets none:
// helm's driver takes no context.
const helmConnectTimeout = "10"

// OpenHelm opens helm's own sql storage driver for namespace ns on this
// store's database, with session put into its connection string
// (WithSession), and checks that the session reached PostgreSQL (a service
// file or a pooler may drop the options, which would leave helm's writes
// unfenced). helm's driver opens a pool of its own per driver and has no
// way to close it; Close reaches it so that a long-running process does not
// leave one pool per operation behind (nothing is opened when this build's
// helm keeps it out of reach). The schema of EnsureSchema is put in place
// once helm's own migrations have run.
func (s *Store) OpenHelm(ctx context.Context, ns, session string) (*HelmDriver, error) {
	if err := CheckHelmPool(); err != nil {
		return nil, err
	}
	dsn, err := WithSession(s.dsn, session)
	if err != nil {
		return nil, err
	}
	if dsn, err = withDefault(dsn, "connect_timeout", helmConnectTimeout); err != nil {
		return nil, err
	}
	d, err := driver.NewSQL(dsn, ns)
	if err != nil {
		return nil, fmt.Errorf("opening helm's sql driver (check the connection string, %s, and that the database answers): %w", EnvConnectionString, err)
	}
	db, err := helmPool(d)
	if err != nil {
		return nil, err
	}
	h := &HelmDriver{SQL: d, db: db}
	var got string
	if err := db.QueryRowContext(ctx, `SELECT coalesce(current_setting('`+settingSession+`', true), '')`).Scan(&got); err != nil {
		_ = h.Close(ctx)
		return nil, fmt.Errorf("reading the lock session of helm's sql connection: %w", err)
	}
	if got != session {
		_ = h.Close(ctx)
		return nil, fmt.Errorf("%w (it reads %q): the connection string's options (-c %s=...) did not reach PostgreSQL, as with a service file that sets options or a pooler that drops them, so helm's writes could not be fenced; connect to PostgreSQL directly, without options in a service file",
			ErrNoSession, strings.TrimSpace(got), settingSession)
	}
	if err := s.EnsureSchema(ctx); err != nil {
		_ = h.Close(ctx)
		return nil, err
	}
	return h, nil
}

// Close closes helm's connection pool and waits, until ctx ends, for the
// connections in use to be given back (database/sql's Close closes only
// the idle ones; a transaction of helm's still open, as helm's upgrade
// goroutine goes on after its context ended, keeps its connection until it
// commits or rolls back). It reports ctx's error when they were not all
// given back; a write of that transaction is still judged by the
// database's trigger, which refuses it once the session no longer holds
// the release's lock row, and whose share lock makes the row's next taker
// wait for its commit.
func (h *HelmDriver) Close(ctx context.Context) error {
	err := h.db.Close()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for h.db.Stats().InUse > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("helm's sql connections still in use: %w", ctx.Err())
		case <-t.C:
		}
	}
	return err
}

// CheckHelmPool fails unless this build's helm keeps its sql driver's pool
// where OpenHelm reaches it (a pointer field named db), before anything is
// opened.
func CheckHelmPool() error {
	f, ok := reflect.TypeFor[driver.SQL]().FieldByName("db")
	if !ok || f.Type.Kind() != reflect.Pointer || !f.Type.Implements(reflect.TypeFor[helmDB]()) {
		return errHelmPool
	}
	return nil
}

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
