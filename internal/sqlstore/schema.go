package sqlstore

import (
	"context"
	"fmt"
)

// Names in the database. The suffix is the schema's version: a change that
// older clients would misread gets new names.
const (
	tableReleases = "releases_v1" // helm's
	tableLocks    = "helm_autorecover_locks_v1"
	tableWrites   = "helm_autorecover_writes_v1"
	seqVersions   = "helm_autorecover_rv_v1"
	funcFence     = "helm_autorecover_fence_v1"
	triggerFence  = "helm_autorecover_fence_v1"
	// settingSession is the connection setting that names the lock session
	// a connection writes for.
	settingSession = "helm_autorecover.session"
	// codeNotHolder is the SQLSTATE of the trigger's refusal.
	codeNotHolder = "HA001"
	// schemaLockKey serialises schema changes between clients
	// (pg_advisory_xact_lock).
	schemaLockKey = 0x68656c6d61720 // "helmar"
	// refusedText is in the trigger's message, for errors that keep only
	// its text.
	refusedText = "does not hold the lock of release"
)

// ddlTables creates the lock rows, the versions they take and the side
// table of writes.
const ddlTables = `
CREATE TABLE IF NOT EXISTS ` + tableLocks + ` (
	namespace TEXT NOT NULL,
	name      TEXT NOT NULL,
	release   TEXT NOT NULL,
	holder    TEXT NOT NULL DEFAULT '',
	version   BIGINT NOT NULL,
	uid       TEXT NOT NULL,
	object    TEXT NOT NULL,
	PRIMARY KEY (namespace, name)
);
CREATE INDEX IF NOT EXISTS ` + tableLocks + `_release ON ` + tableLocks + ` (namespace, release);
CREATE SEQUENCE IF NOT EXISTS ` + seqVersions + `;
CREATE TABLE IF NOT EXISTS ` + tableWrites + ` (
	"key"      TEXT NOT NULL,
	namespace  TEXT NOT NULL,
	session    TEXT NOT NULL,
	written_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY ("key", namespace)
);
`

// ddlFence is the trigger on helm's releases: a connection that names a
// lock session writes a release's rows only while that session holds the
// release's lock row (FOR SHARE: a taker's update of the row waits for the
// write, and the write after a take sees the taker); every write notes its
// session and the database's time in the side table, in the same
// transaction.
const ddlFence = `
CREATE OR REPLACE FUNCTION ` + funcFence + `() RETURNS trigger LANGUAGE plpgsql AS $fence$
DECLARE
	s TEXT := coalesce(current_setting('` + settingSession + `', true), '');
	rel TEXT;
	ns TEXT;
	h TEXT;
BEGIN
	IF TG_OP = 'DELETE' THEN
		rel := OLD.name; ns := OLD.namespace;
	ELSE
		rel := NEW.name; ns := NEW.namespace;
	END IF;
	IF s <> '' THEN
		SELECT holder INTO h FROM ` + tableLocks + ` WHERE namespace = ns AND release = rel FOR SHARE;
		IF h IS DISTINCT FROM s THEN
			RAISE EXCEPTION 'helm-autorecover: session % ` + refusedText + ` "%" in namespace "%" (%); the write was refused',
				s, rel, ns, CASE WHEN h IS NULL THEN 'there is no lock' WHEN h = '' THEN 'the lock was released' ELSE 'session ' || h || ' holds it' END
				USING ERRCODE = '` + codeNotHolder + `';
		END IF;
	END IF;
	IF TG_OP = 'DELETE' THEN
		DELETE FROM ` + tableWrites + ` WHERE "key" = OLD."key" AND namespace = OLD.namespace;
		RETURN OLD;
	END IF;
	INSERT INTO ` + tableWrites + ` ("key", namespace, session, written_at) VALUES (NEW."key", NEW.namespace, s, clock_timestamp())
		ON CONFLICT ("key", namespace) DO UPDATE SET session = EXCLUDED.session, written_at = EXCLUDED.written_at;
	RETURN NEW;
END
$fence$;
DROP TRIGGER IF EXISTS ` + triggerFence + ` ON ` + tableReleases + `;
CREATE TRIGGER ` + triggerFence + ` BEFORE INSERT OR UPDATE OR DELETE ON ` + tableReleases + `
	FOR EACH ROW EXECUTE FUNCTION ` + funcFence + `();
`

// schemaState is one query that tells whether the tables and the trigger
// are in place.
const schemaState = `SELECT to_regclass('` + tableReleases + `') IS NOT NULL,
	to_regclass('` + tableWrites + `') IS NOT NULL AND to_regclass('` + tableLocks + `') IS NOT NULL,
	EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '` + triggerFence + `' AND tgrelid = to_regclass('` + tableReleases + `'))`

// EnsureSchema creates the lock rows, the side table and, once helm has
// created its table of releases, the trigger that fences helm's writes.
// When all is in place it costs one query, once per Store. Until helm's
// table exists there is no release to fence, and the trigger is added by
// the next call after it does: every guarded command calls it after helm's
// storage was initialised and before it takes a lock.
func (s *Store) EnsureSchema(ctx context.Context) error {
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaOK {
		return nil
	}
	var releases, tables, trigger bool
	if err := s.db.QueryRowContext(ctx, schemaState).Scan(&releases, &tables, &trigger); err != nil {
		return fmt.Errorf("reading the schema of helm's sql database: %w", err)
	}
	if tables && trigger {
		s.schemaOK = true
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
		return fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	if _, err := tx.ExecContext(ctx, ddlTables); err != nil {
		return fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	if releases {
		if _, err := tx.ExecContext(ctx, ddlFence); err != nil {
			return fmt.Errorf("creating the trigger that fences helm's writes on %s: %w", tableReleases, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	s.schemaOK = releases
	return nil
}
