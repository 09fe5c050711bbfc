package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// lockRows names the lock rows in the errors they return, which the lock
// reads as it reads the API server's (NotFound, AlreadyExists, Conflict).
var lockRows = schema.GroupResource{Group: "helm-autorecover.io", Resource: "lockrows"}

// Locks returns the lock rows of namespace ns ("" for all, to List): the
// store of a lock.NewBackend(..., lock.StoreSQL, ...). Each release's lock
// is a row: the lock record and the waiters' queue (row.object), the
// session that holds it (row.holder, which the trigger on helm's rows
// checks) and a version every write changes; every write is conditional
// on the version read. The rows cannot be watched: the lock polls.
func (s *Store) Locks(ns string) lock.Store { return &locks{s: s, ns: ns} }

type locks struct {
	s  *Store
	ns string
}

// rowObject is what a row's object column holds: the lock record and the
// waiters' queue, each as the lock encodes it (lock.Record.Encode,
// lock.EncodeQueue).
type rowObject struct {
	Record string `json:"record,omitempty"`
	Queue  string `json:"queue,omitempty"`
}

// rowVersion is a snapshot's version: the row's version and identity, and
// its holder and object as read (a write keeps what it does not change).
type rowVersion struct {
	version int64
	uid     string
	holder  string
	object  rowObject
}

// snapshot is row name as the lock reads it. The row has no spec of its
// own: its record implies one (lock.SpecOf), as a release record's does.
func (k *locks) snapshot(ns, name, release, holder string, obj rowObject, version int64, uid string) *lock.Snapshot {
	s := &lock.Snapshot{
		Namespace: ns, Name: name, Release: release,
		Raw: obj.Record, HasRecord: obj.Record != "",
		Spec:    lock.SpecOf(obj.Record),
		Queue:   lock.DecodeQueue(obj.Queue),
		Version: rowVersion{version: version, uid: uid, holder: holder, object: obj},
	}
	if s.HasRecord {
		s.Record, s.RecordErr = lock.DecodeRecord(s.Raw)
	}
	if h := lock.HolderOf(&s.Spec); holder != "" && holder != h && h != lock.UnreadableHolder {
		// The trigger lets the session the holder column names write
		// helm's rows: the row is held by it, with no expiry, whatever its
		// record says (a row of an earlier layout, which kept a Lease
		// object; a row edited by hand). Judged from its record alone it
		// was free, and taken while that session could still write.
		s.Spec = coordinationv1.LeaseSpec{HolderIdentity: &holder}
		s.RecordErr = fmt.Errorf("lock row %q of release %q in namespace %q names session %s as its holder, which its lock record does not (written by an earlier build of helm-autorecover, or edited by hand)",
			name, release, ns, holder)
	}
	return s
}

func decodeRow(name, object string) (rowObject, error) {
	var o rowObject
	if err := json.Unmarshal([]byte(object), &o); err != nil {
		return rowObject{}, fmt.Errorf("reading lock row %q: %w", name, err)
	}
	return o, nil
}

func (k *locks) Read(ctx context.Context, name string) (*lock.Snapshot, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	var release, holder, object, uid string
	var version int64
	err = k.s.db.QueryRowContext(ctx, `SELECT release, holder, object, version, uid FROM `+n.locks+` WHERE namespace = $1 AND name = $2`, k.ns, name).Scan(&release, &holder, &object, &version, &uid)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierrors.NewNotFound(lockRows, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lock row %q in namespace %q: %w", name, k.ns, err)
	}
	obj, err := decodeRow(name, object)
	if err != nil {
		return nil, err
	}
	return k.snapshot(k.ns, name, release, holder, obj, version, uid), nil
}

// holderOf is the session a row holding rec names as the holder, which
// the trigger on helm's rows checks: none once released.
func holderOf(rec lock.Record) string {
	if !rec.ReleasedAt.IsZero() {
		return ""
	}
	return rec.Session
}

func (k *locks) Create(ctx context.Context, name string, rec lock.Record) (*lock.Snapshot, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	enc, err := rec.Encode()
	if err != nil {
		return nil, err
	}
	obj := rowObject{Record: enc}
	object, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("writing lock row %q: %w", name, err)
	}
	uid := uuid.NewString()
	var version int64
	err = k.s.db.QueryRowContext(ctx, `INSERT INTO `+n.locks+` (namespace, name, release, holder, version, uid, object)
		VALUES ($1, $2, $3, $4, nextval($7), $5, $6) ON CONFLICT DO NOTHING RETURNING version`,
		k.ns, name, rec.Release, holderOf(rec), uid, string(object), n.seq).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierrors.NewAlreadyExists(lockRows, name)
	}
	if err != nil {
		return nil, fmt.Errorf("creating lock row %q in namespace %q: %w", name, k.ns, err)
	}
	return k.snapshot(k.ns, name, rec.Release, holderOf(rec), obj, version, uid), nil
}

// Announce implements lock.Store: a row names its holder from its take on.
func (k *locks) Announce(_ context.Context, from *lock.Snapshot, _ lock.Record) (*lock.Snapshot, error) {
	return from, nil
}

func (k *locks) Take(ctx context.Context, from *lock.Snapshot, rec lock.Record, queue []lock.Waiter) (*lock.Snapshot, error) {
	enc, err := lock.EncodeQueue(queue)
	if err != nil {
		return nil, err
	}
	return k.write(ctx, from, &rec, &enc)
}

func (k *locks) Renew(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return k.write(ctx, from, &rec, nil)
}

func (k *locks) Release(ctx context.Context, from *lock.Snapshot, rec lock.Record, _ string) (*lock.Snapshot, error) {
	return k.write(ctx, from, &rec, nil)
}

func (k *locks) ForceRelease(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return k.write(ctx, from, &rec, nil)
}

func (k *locks) Enqueue(ctx context.Context, from *lock.Snapshot, queue []lock.Waiter) (*lock.Snapshot, error) {
	enc, err := lock.EncodeQueue(queue)
	if err != nil {
		return nil, err
	}
	return k.write(ctx, from, nil, &enc)
}

// write updates the row from was read from, conditional on its version:
// its record to rec and its queue to queue, each kept as read when nil.
func (k *locks) write(ctx context.Context, from *lock.Snapshot, rec *lock.Record, queue *string) (*lock.Snapshot, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	v := from.Version.(rowVersion)
	obj, release, holder := v.object, from.Release, v.holder
	if rec != nil {
		if obj.Record, err = rec.Encode(); err != nil {
			return nil, err
		}
		release, holder = rec.Release, holderOf(*rec)
	}
	if queue != nil {
		obj.Queue = *queue
	}
	object, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("writing lock row %q: %w", from.Name, err)
	}
	var version int64
	err = k.s.db.QueryRowContext(ctx, `UPDATE `+n.locks+` SET release = $3, holder = $4, object = $5, version = nextval($7)
		WHERE namespace = $1 AND name = $2 AND version = $6 AND uid = $8 RETURNING version`,
		k.ns, from.Name, release, holder, string(object), v.version, n.seq, v.uid).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, k.missedWrite(ctx, n, from.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("writing lock row %q in namespace %q: %w", from.Name, k.ns, err)
	}
	return k.snapshot(k.ns, from.Name, release, holder, obj, version, v.uid), nil
}

// missedWrite tells why a conditional write matched no row: the row is
// gone (NotFound) or changed since it was read (Conflict).
func (k *locks) missedWrite(ctx context.Context, n names, name string) error {
	var one int
	err := k.s.db.QueryRowContext(ctx, `SELECT 1 FROM `+n.locks+` WHERE namespace = $1 AND name = $2`, k.ns, name).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return apierrors.NewNotFound(lockRows, name)
	case err != nil:
		return fmt.Errorf("reading lock row %q in namespace %q: %w", name, k.ns, err)
	}
	return apierrors.NewConflict(lockRows, name, errors.New("the lock row changed since it was read"))
}

func (k *locks) Delete(ctx context.Context, from *lock.Snapshot) error {
	n, err := k.s.schema(ctx)
	if err != nil {
		return err
	}
	v := from.Version.(rowVersion)
	res, err := k.s.db.ExecContext(ctx, `DELETE FROM `+n.locks+` WHERE namespace = $1 AND name = $2 AND version = $3 AND uid = $4`,
		k.ns, from.Name, v.version, v.uid)
	if err != nil {
		return fmt.Errorf("deleting lock row %q in namespace %q: %w", from.Name, k.ns, err)
	}
	if gone, err := res.RowsAffected(); err == nil && gone == 0 {
		return k.missedWrite(ctx, n, from.Name)
	}
	return nil
}

func (k *locks) List(ctx context.Context) ([]*lock.Snapshot, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	q := `SELECT namespace, name, release, holder, object, version, uid FROM ` + n.locks
	var args []any
	if k.ns != "" {
		q += ` WHERE namespace = $1`
		args = append(args, k.ns)
	}
	rows, err := k.s.db.QueryContext(ctx, q+` ORDER BY namespace, name`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing lock rows %s: %w", lock.InNamespace(k.ns), err)
	}
	defer func() { _ = rows.Close() }()
	var out []*lock.Snapshot
	for rows.Next() {
		var ns, name, release, holder, object, uid string
		var version int64
		if err := rows.Scan(&ns, &name, &release, &holder, &object, &version, &uid); err != nil {
			return nil, fmt.Errorf("listing lock rows %s: %w", lock.InNamespace(k.ns), err)
		}
		obj, err := decodeRow(name, object)
		if err != nil {
			return nil, err
		}
		out = append(out, k.snapshot(ns, name, release, holder, obj, version, uid))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing lock rows %s: %w", lock.InNamespace(k.ns), err)
	}
	return out, nil
}

// errNoWatch: the rows cannot be watched, the lock polls instead.
var errNoWatch = apierrors.NewMethodNotSupported(lockRows, "watch")

func (k *locks) Watch(context.Context, *lock.Snapshot) (watch.Interface, error) {
	return nil, errNoWatch
}

func (k *locks) WatchQueue(context.Context, string) (watch.Interface, func(runtime.Object) ([]lock.Waiter, bool), error) {
	return nil, nil, errNoWatch
}

// Renewal implements lock.Store: nothing is seen on a watch of the rows.
func (k *locks) Renewal(string, runtime.Object) (string, time.Time, time.Time, bool) {
	return "", time.Time{}, time.Time{}, false
}

// Change implements lock.Store: nothing is seen on a watch of the rows.
func (k *locks) Change(*lock.Snapshot, watch.Event) (lock.Change, bool) { return lock.Change{}, false }

// Carried implements lock.Store: a row is not copied onto helm's rows.
func (k *locks) Carried(rec lock.Record) lock.Record { return rec }

// Written implements lock.Store: a row is not copied onto helm's rows.
func (k *locks) Written(metav1.ObjectMeta) (*lock.Record, string, int) { return nil, "", 0 }
