package sqlstore

import (
	"context"
	"crypto/md5" //nolint:gosec // a change detector, as the database computes it (md5()), not a secret
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// KindRow is the kind of a release record of the sql driver.
const KindRow = "SQL row"

// releaseResource names helm's rows in NotFound and Conflict errors.
var releaseResource = schema.GroupResource{Resource: tableReleases}

// Records returns helm's release rows as release records.
func (s *Store) Records() helmx.Records { return rows{s} }

// rows is helmx.Records over helm's table of releases. A row's
// resourceVersion is a digest of its body and status: an update is
// conditional on the content read.
type rows struct{ s *Store }

func (rows) Kind() string     { return KindRow }
func (rows) Resource() string { return "" }

// WriteFenced is true: the database's trigger refuses a write made for a
// session that does not hold the release's lock row.
func (rows) WriteFenced() bool { return true }

func (rows) ReadCommand(ns, name string) string {
	return fmt.Sprintf(`psql "$%s" -c "SELECT * FROM %s WHERE key = '%s' AND namespace = '%s'"`, EnvConnectionString, tableReleases, name, ns)
}

// versionOf is a row's resourceVersion: md5 of its body and status, as the
// database computes it in Update's condition.
func versionOf(body, status string) string {
	sum := md5.Sum([]byte(body + "/" + status)) //nolint:gosec // see the import
	return hex.EncodeToString(sum[:])
}

// selectRows reads helm's rows with the session and the age (in the
// database's clock) of their last write.
func selectRows(n names) string {
	return `SELECT r."key", r.namespace, r.body, r.name, r.version, r.status, r.owner,
	coalesce(w.session, ''), extract(epoch FROM (now() - w.written_at))
	FROM ` + n.releases + ` r LEFT JOIN ` + n.writes + ` w ON w."key" = r."key" AND w.namespace = r.namespace`
}

// firstSeen notes rows written before the trigger existed as written now,
// by no session: their age counts from the first time a client saw them.
func firstSeen(n names) string {
	return `INSERT INTO ` + n.writes + ` ("key", namespace, session, written_at)
	SELECT "key", namespace, '', now() FROM ` + n.releases + ` WHERE "key" = ANY($1) AND namespace = ANY($2)
	ON CONFLICT DO NOTHING`
}

func (r rows) List(ctx context.Context, ns, selector string) ([]helmx.Record, string, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, "", apierrors.NewBadRequest(fmt.Sprintf("label selector %q: %v", selector, err))
	}
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if ns != "" {
		add("r.namespace = $%d", ns)
	}
	if name, ok := sel.RequiresExactMatch(helmx.LabelName); ok {
		add("r.name = $%d", name)
	}
	recs, err := r.query(ctx, where, args)
	if err != nil {
		return nil, "", fmt.Errorf("reading helm's release rows %s: %w", lock.InNamespace(ns), err)
	}
	out := recs[:0]
	for _, rec := range recs {
		if sel.Matches(labels.Set(rec.Meta.Labels)) {
			out = append(out, rec)
		}
	}
	return out, "", nil
}

// ListMeta is List: a row is read whole.
func (r rows) ListMeta(ctx context.Context, ns, selector string) ([]helmx.Record, string, error) {
	return r.List(ctx, ns, selector)
}

func (r rows) Get(ctx context.Context, ns, name string) (helmx.Record, error) {
	recs, err := r.query(ctx, []string{"r.namespace = $1", `r."key" = $2`}, []any{ns, name})
	if err != nil {
		return helmx.Record{}, fmt.Errorf("reading helm's release row %q in namespace %q: %w", name, ns, err)
	}
	if len(recs) == 0 {
		return helmx.Record{}, apierrors.NewNotFound(releaseResource, name)
	}
	return recs[0], nil
}

func (r rows) Newest(ctx context.Context, ns, selector string) (helmx.Record, bool, string, error) {
	rs, listRV, err := r.List(ctx, ns, selector)
	if err != nil {
		return helmx.Record{}, false, "", err
	}
	rec, ok := records.NewestOf(rs)
	return rec, ok, listRV, nil
}

// query reads the rows matching where (joined by AND) as records. A row
// whose last write the trigger did not see (written before it existed) is
// noted as first seen now.
func (r rows) query(ctx context.Context, where []string, args []any) ([]helmx.Record, error) {
	n, err := r.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	q := selectRows(n)
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	res, err := r.s.db.QueryContext(ctx, q, args...)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "42P01" {
		return nil, nil // helm has not created its table yet: no release
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Close() }()
	type row struct {
		key, ns, body, name, status, owner, session string
		version                                     int
		age                                         sql.NullFloat64
	}
	var got []row
	var unseenKeys, unseenNS []string
	for res.Next() {
		var w row
		if err := res.Scan(&w.key, &w.ns, &w.body, &w.name, &w.version, &w.status, &w.owner, &w.session, &w.age); err != nil {
			return nil, err
		}
		if !w.age.Valid {
			unseenKeys, unseenNS = append(unseenKeys, w.key), append(unseenNS, w.ns)
		}
		got = append(got, w)
	}
	if err := res.Err(); err != nil {
		return nil, err
	}
	seen := len(unseenKeys) == 0
	if !seen {
		// A reader that may not write the side table (a read-only role)
		// still reads the history; those rows' ages stay unknown, and
		// nothing is recovered by age.
		_, err := r.s.db.ExecContext(ctx, firstSeen(n), pq.Array(unseenKeys), pq.Array(unseenNS))
		seen = err == nil
	}
	// The server's clock is read after the rows: a write's time placed on
	// it (now less its age) is never earlier than the write was.
	var latest time.Time
	if len(got) > 0 {
		now, err := r.s.now(ctx)
		if err != nil {
			return nil, err
		}
		latest = now.Latest
	}
	out := make([]helmx.Record, 0, len(got))
	for _, w := range got {
		meta := metav1.ObjectMeta{
			Name:      w.key,
			Namespace: w.ns,
			Labels: map[string]string{
				helmx.LabelName: w.name, helmx.LabelOwner: w.owner, helmx.LabelStatus: w.status, helmx.LabelVersion: strconv.Itoa(w.version),
			},
			ResourceVersion: versionOf(w.body, w.status),
		}
		if w.age.Valid || seen {
			// The row's last write, which the trigger notes, is its
			// creation time and its last change at once.
			age := time.Duration(max(0, w.age.Float64) * float64(time.Second))
			at := metav1.NewTime(latest.Add(-age))
			meta.CreationTimestamp = at
			meta.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate, Time: &at}}
		}
		if w.session != "" {
			// The session that wrote the row last, as a lock record names
			// it, naming the row's own revision as the write fence's copy
			// on a record does: recovery attributes the revision to that
			// holder, whichever revision its lock row names (an upgrade's
			// --rollback-on-failure writes a second under one lock).
			enc, err := (&lock.Record{Schema: lock.SchemaVersion, Session: w.session, Release: w.name, Namespace: w.ns, Revision: w.version}).Encode()
			if err != nil {
				return nil, err
			}
			meta.Annotations = map[string]string{lock.AnnotationRecord: enc}
		}
		out = append(out, helmx.Record{Kind: KindRow, Meta: meta, Payload: []byte(w.body)})
	}
	return out, nil
}

// Update writes r's body and status back as the session WithWriter put in
// ctx, conditional on the content r was read with. The trigger refuses it
// (lock.ErrLost) when that session does not hold the release's lock row.
func (r rows) Update(ctx context.Context, rec helmx.Record, _ string) (helmx.Record, error) {
	subject := fmt.Sprintf("helm's release row %q in namespace %q", rec.Meta.Name, rec.Meta.Namespace)
	session := helmx.WriterOf(ctx)
	if session == "" {
		return helmx.Record{}, fmt.Errorf("writing %s: no lock session to write as; the sql driver's rows are written only under a lock", subject)
	}
	status := rec.Meta.Labels[helmx.LabelStatus]
	if status == "" {
		return helmx.Record{}, fmt.Errorf("writing %s: the record names no status", subject)
	}
	n, err := r.s.schema(ctx)
	if err != nil {
		return helmx.Record{}, err
	}
	tx, err := r.s.db.BeginTx(ctx, nil)
	if err != nil {
		return helmx.Record{}, fmt.Errorf("writing %s: %w", subject, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT set_config('`+settingSession+`', $1, true)`, session); err != nil {
		return helmx.Record{}, fmt.Errorf("writing %s: %w", subject, err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE `+n.releases+` SET body = $1, status = $2, modifiedat = extract(epoch FROM now())::integer
		WHERE "key" = $3 AND namespace = $4 AND md5(body || '/' || status) = $5`,
		string(rec.Payload), status, rec.Meta.Name, rec.Meta.Namespace, rec.Meta.ResourceVersion)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == codeNotHolder {
		return helmx.Record{}, fmt.Errorf("writing %s: %s: %w", subject, pqErr.Message, lock.ErrLost)
	}
	if err != nil {
		return helmx.Record{}, fmt.Errorf("writing %s: %w", subject, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if _, gerr := r.Get(ctx, rec.Meta.Namespace, rec.Meta.Name); apierrors.IsNotFound(gerr) {
			return helmx.Record{}, gerr
		}
		return helmx.Record{}, apierrors.NewConflict(releaseResource, rec.Meta.Name, errors.New("the row changed since it was read"))
	}
	if err := tx.Commit(); err != nil {
		return helmx.Record{}, fmt.Errorf("writing %s: %w", subject, err)
	}
	return r.Get(ctx, rec.Meta.Namespace, rec.Meta.Name)
}

// IsRefused reports whether err is the trigger refusing a write made for a
// session that does not hold the release's lock row, as helm returns it
// (helm keeps the database's error as text).
func IsRefused(err error) bool {
	if err == nil {
		return false
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == codeNotHolder {
		return true
	}
	return strings.Contains(err.Error(), refusedText)
}

// Pending lists the releases that have a row of helm's in one of statuses
// (a revision an operation was writing), in namespaces (every namespace
// when empty), each once, sorted. It reads no release body: the controller
// asks it every poll. Before helm's table exists there is none.
func (s *Store) Pending(ctx context.Context, namespaces, statuses []string) ([]types.NamespacedName, error) {
	n, err := s.schema(ctx)
	if err != nil {
		return nil, err
	}
	s.schemaMu.Lock()
	ready := s.schemaOK
	s.schemaMu.Unlock()
	if !ready {
		return nil, nil
	}
	q := `SELECT DISTINCT namespace, name FROM ` + n.releases + ` WHERE owner = 'helm' AND status = ANY($1)`
	args := []any{pq.Array(statuses)}
	if len(namespaces) > 0 {
		q += ` AND namespace = ANY($2)`
		args = append(args, pq.Array(namespaces))
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY namespace, name`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing pending releases in helm's sql database: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []types.NamespacedName
	for rows.Next() {
		var r types.NamespacedName
		if err := rows.Scan(&r.Namespace, &r.Name); err != nil {
			return nil, fmt.Errorf("listing pending releases in helm's sql database: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing pending releases in helm's sql database: %w", err)
	}
	return out, nil
}
