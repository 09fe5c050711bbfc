package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // helm's SQL storage driver speaks to PostgreSQL through it
	"k8s.io/apimachinery/pkg/util/rand"
)

var (
	pgOnce sync.Once
	pgBase string // connection string of the server's postgres database
	pgErr  error
)

// Postgres returns the connection string of a fresh database on the local
// PostgreSQL server (hack/local-postgres.sh, started once per test binary
// when none runs), for HELM_DRIVER_SQL_CONNECTION_STRING; the database is
// dropped when t ends. It skips t under -short and fails it when the
// server cannot start.
func (e *Env) Postgres(t testing.TB) string {
	t.Helper()
	pgOnce.Do(func() { pgBase, pgErr = startPostgres(e.RepoRoot) })
	if pgErr != nil {
		t.Fatalf("local PostgreSQL: %v", pgErr)
	}
	name := "t_" + rand.String(10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgExec(ctx, pgBase, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgExec(ctx, pgBase, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("dropping database %s: %v", name, err)
		}
	})
	return strings.Replace(pgBase, "dbname=postgres", "dbname="+name, 1)
}

// SQLHistory returns "1:deployed 2:failed ..." for the release as helm's
// SQL driver stores it in the database at dsn, oldest first.
func SQLHistory(t testing.TB, dsn, ns, release string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	rows, err := db.QueryContext(ctx, `SELECT version, status FROM releases_v1 WHERE name = $1 AND namespace = $2 AND owner = 'helm' ORDER BY version`, release, ns)
	if err != nil {
		t.Fatalf("reading release %s/%s from the SQL store: %v", ns, release, err)
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var v int
		var status string
		if err := rows.Scan(&v, &status); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d:%s", v, status))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func startPostgres(root string) (string, error) {
	script := filepath.Join(root, "hack", "local-postgres.sh")
	up := exec.Command(script, "up")
	up.Stdout, up.Stderr = os.Stderr, os.Stderr
	if err := up.Run(); err != nil {
		return "", fmt.Errorf("hack/local-postgres.sh up: %w", err)
	}
	out, err := exec.Command(script, "env").Output()
	if err != nil {
		return "", fmt.Errorf("hack/local-postgres.sh env: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "export HELM_DRIVER_SQL_CONNECTION_STRING="); ok {
			return strings.Trim(v, "'"), nil
		}
	}
	return "", fmt.Errorf("hack/local-postgres.sh env printed no connection string: %q", out)
}

func pgExec(ctx context.Context, dsn, stmt string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	_, err = db.ExecContext(ctx, stmt)
	return err
}
