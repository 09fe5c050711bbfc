package protocol

import (
	"context"
	"fmt"
	"os"

	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
)

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
