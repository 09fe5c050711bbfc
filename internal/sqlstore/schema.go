package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/lib/pq"
)

// Names in the database. The suffix is the schema's version: a change that
// older clients would misread gets new names.
const (
	tableReleases = "releases_v1" // helm's
	// TableLocks holds the lock rows (Locks).
	TableLocks   = "helm_autorecover_locks_v1"
	tableWrites  = "helm_autorecover_writes_v1"
	seqVersions  = "helm_autorecover_rv_v1"
	funcFence    = "helm_autorecover_fence_v1"
	funcWritten  = "helm_autorecover_written_v1"
	triggerFence = "helm_autorecover_fence_v1"
	// triggerWritten notes a write's time at its commit.
	triggerWritten = "helm_autorecover_written_v1"
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

// names are the qualified names of the objects in the schema of helm's
// table: the trigger and every client find the same ones whatever their
// search_path.
type names struct {
	releases, locks, writes, seq string
}

func qualified(schema string) names {
	q := func(n string) string { return pq.QuoteIdentifier(schema) + "." + pq.QuoteIdentifier(n) }
	return names{releases: q(tableReleases), locks: q(TableLocks), writes: q(tableWrites), seq: q(seqVersions)}
}

// ddlTables creates the lock rows, the versions they take and the side
// table of writes in schema.
func ddlTables(n names) string {
	return `
CREATE TABLE IF NOT EXISTS ` + n.locks + ` (
	namespace TEXT NOT NULL,
	name      TEXT NOT NULL,
	release   TEXT NOT NULL,
	holder    TEXT NOT NULL DEFAULT '',
	version   BIGINT NOT NULL,
	uid       TEXT NOT NULL,
	object    TEXT NOT NULL,
	PRIMARY KEY (namespace, name)
);
CREATE INDEX IF NOT EXISTS ` + TableLocks + `_release ON ` + n.locks + ` (namespace, release);
CREATE SEQUENCE IF NOT EXISTS ` + n.seq + `;
CREATE TABLE IF NOT EXISTS ` + n.writes + ` (
	"key"      TEXT NOT NULL,
	namespace  TEXT NOT NULL,
	session    TEXT NOT NULL,
	written_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY ("key", namespace)
);
`
}

// ddlFence is the trigger on helm's releases, in schema: a connection that
// names a lock session writes a release's rows only while that session
// holds the release's lock row (FOR SHARE: a taker's update of the row
// waits for the write's transaction, and a write after a take sees the
// taker). A second trigger, deferred to the transaction's commit, notes
// each written row's session and the database's time then: a row is
// never older than its note says (helm's create is a transaction, and the
// row is seen only once it commits). Both functions run as their owner with
// a fixed search_path, so that any writer (stock helm as another role, a
// client with another search_path) reaches the same tables.
func ddlFence(schema string, n names) string {
	fence := pq.QuoteIdentifier(schema) + "." + pq.QuoteIdentifier(funcFence)
	written := pq.QuoteIdentifier(schema) + "." + pq.QuoteIdentifier(funcWritten)
	path := pq.QuoteIdentifier(schema) + ", pg_temp"
	return `
CREATE OR REPLACE FUNCTION ` + fence + `() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = ` + path + ` AS $fence$
DECLARE
	s TEXT := coalesce(current_setting('` + settingSession + `', true), '');
	rel TEXT;
	ns TEXT;
	h TEXT;
BEGIN
	IF TG_RELID <> ` + pq.QuoteLiteral(n.releases) + `::regclass THEN
		RAISE EXCEPTION 'helm-autorecover: this trigger serves helm''s table of releases only';
	END IF;
	IF TG_OP = 'DELETE' THEN
		rel := OLD.name; ns := OLD.namespace;
	ELSE
		rel := NEW.name; ns := NEW.namespace;
	END IF;
	IF s <> '' THEN
		SELECT holder INTO h FROM ` + n.locks + ` WHERE namespace = ns AND release = rel FOR SHARE;
		IF h IS DISTINCT FROM s THEN
			RAISE EXCEPTION 'helm-autorecover: session % ` + refusedText + ` "%" in namespace "%" (%); the write was refused',
				s, rel, ns, CASE WHEN h IS NULL THEN 'there is no lock' WHEN h = '' THEN 'the lock was released' ELSE 'session ' || h || ' holds it' END
				USING ERRCODE = '` + codeNotHolder + `';
		END IF;
	END IF;
	IF TG_OP = 'DELETE' THEN
		DELETE FROM ` + n.writes + ` WHERE "key" = OLD."key" AND namespace = OLD.namespace;
		RETURN OLD;
	END IF;
	RETURN NEW;
END
$fence$;
CREATE OR REPLACE FUNCTION ` + written + `() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = ` + path + ` AS $written$
BEGIN
	IF TG_RELID <> ` + pq.QuoteLiteral(n.releases) + `::regclass THEN
		RAISE EXCEPTION 'helm-autorecover: this trigger serves helm''s table of releases only';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM ` + n.releases + ` WHERE "key" = NEW."key" AND namespace = NEW.namespace) THEN
		RETURN NULL; -- deleted later in the same transaction
	END IF;
	INSERT INTO ` + n.writes + ` ("key", namespace, session, written_at)
		VALUES (NEW."key", NEW.namespace, coalesce(current_setting('` + settingSession + `', true), ''), clock_timestamp())
		ON CONFLICT ("key", namespace) DO UPDATE SET session = EXCLUDED.session, written_at = EXCLUDED.written_at;
	RETURN NULL;
END
$written$;
REVOKE EXECUTE ON FUNCTION ` + fence + `() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ` + written + `() FROM PUBLIC;
DROP TRIGGER IF EXISTS ` + triggerFence + ` ON ` + n.releases + `;
CREATE TRIGGER ` + triggerFence + ` BEFORE INSERT OR UPDATE OR DELETE ON ` + n.releases + `
	FOR EACH ROW EXECUTE FUNCTION ` + fence + `();
DROP TRIGGER IF EXISTS ` + triggerWritten + ` ON ` + n.releases + `;
CREATE CONSTRAINT TRIGGER ` + triggerWritten + ` AFTER INSERT OR UPDATE ON ` + n.releases + `
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + written + `();
`
}

// schemaState is one query that tells the schema of helm's table (or the
// connection's current schema when there is none yet), whether the
// tables and both triggers are in place and enabled, and the lock session
// the connection names.
const schemaState = `WITH r AS (SELECT to_regclass('` + tableReleases + `') AS oid)
SELECT coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = r.oid), current_schema()),
	r.oid IS NOT NULL,
	(SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgrelid = r.oid AND t.tgenabled IN ('O', 'A')
		AND p.pronamespace = (SELECT c.relnamespace FROM pg_class c WHERE c.oid = r.oid)
		AND ((t.tgname = '` + triggerFence + `' AND p.proname = '` + funcFence + `') OR (t.tgname = '` + triggerWritten + `' AND p.proname = '` + funcWritten + `' AND t.tgdeferrable))),
	coalesce(current_setting('` + settingSession + `', true), '')
FROM r`

// EnsureSchema creates the lock rows, the side table and, once helm has
// created its table of releases, the triggers that fence helm's writes,
// all in the schema of helm's table. When all is in place it costs one
// query, once per Store. Until helm's table exists there is no release to
// fence, and the triggers are added by the next call after it does: every
// guarded command calls it after helm's storage was initialised and before
// it takes a lock.
func (s *Store) EnsureSchema(ctx context.Context) error {
	_, err := s.schema(ctx)
	return err
}

// schema is EnsureSchema, returning the qualified names.
func (s *Store) schema(ctx context.Context) (names, error) {
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaOK {
		return s.names, nil
	}
	var schema, session string
	var releases bool
	var triggers int
	if err := s.db.QueryRowContext(ctx, schemaState).Scan(&schema, &releases, &triggers, &session); err != nil {
		return names{}, fmt.Errorf("reading the schema of helm's sql database: %w", err)
	}
	n := qualified(schema)
	s.names, s.connSession = n, session
	if releases && triggers == 2 {
		s.schemaOK = true
		return n, nil
	}
	if !releases && s.tablesMade {
		// Nothing to add until helm creates its table: only the query
		// above is asked again, to notice it.
		return n, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return names{}, fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
		return names{}, fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	if _, err := tx.ExecContext(ctx, ddlTables(n)); err != nil {
		return names{}, fmt.Errorf("creating helm-autorecover's tables in schema %s of helm's sql database: %w", schema, err)
	}
	if releases {
		if _, err := tx.ExecContext(ctx, ddlFence(schema, n)); err != nil {
			return names{}, fmt.Errorf("creating the triggers that fence helm's writes on %s (the database user must own it): %w", n.releases, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return names{}, fmt.Errorf("creating helm-autorecover's tables in helm's sql database: %w", err)
	}
	s.schemaOK, s.tablesMade = releases, true
	return n, nil
}

// ErrNoSession: the database connection does not name the lock session
// the command was given (CheckSession).
var ErrNoSession = errors.New("the database connection does not carry this command's lock session")

// CheckSession fails unless the store's connections name session as their
// lock session: helm opens its connections with the same connection string,
// and a session that does not reach them (a service file or a connection
// pooler that drops the options) would leave helm's writes unfenced.
func (s *Store) CheckSession(ctx context.Context, session string) error {
	if _, err := s.schema(ctx); err != nil {
		return err
	}
	s.schemaMu.Lock()
	got := s.connSession
	s.schemaMu.Unlock()
	if session == "" || got != session {
		return fmt.Errorf("%w (it reads %q): the connection string's options (-c %s=...) did not reach PostgreSQL, as with a service file that sets options or a pooler that drops them, so helm's writes could not be fenced; connect to PostgreSQL directly, without options in a service file",
			ErrNoSession, strings.TrimSpace(got), settingSession)
	}
	return nil
}
