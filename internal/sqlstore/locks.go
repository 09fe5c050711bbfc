package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
)

// leaseResource names the lock rows in the errors they return, which the
// lock reads as it reads the API server's.
var leaseResource = coordinationv1.Resource("leases")

// Locks returns the lock rows of namespace ns ("" for all, to List) as
// Leases: the store of a leasestore.NewRowsBackend(..., lock.StoreSQL, ...).
func (s *Store) Locks(ns string) leasestore.LeaseAPI { return &locks{s: s, ns: ns} }

type locks struct {
	s  *Store
	ns string
}

// decodeLease reads the object of row name and sets the version and
// identity the row holds.
func decodeLease(name, object string, version int64, uid string) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	if err := json.Unmarshal([]byte(object), &l); err != nil {
		return nil, fmt.Errorf("reading lock row %q: %w", name, err)
	}
	l.ResourceVersion = strconv.FormatInt(version, 10)
	l.UID = types.UID(uid)
	return &l, nil
}

// encodeLease is what a row stores of l: its object (without the version,
// which the row keeps), the release it locks and its holder.
func encodeLease(l *coordinationv1.Lease) (object, release, holder string, err error) {
	c := l.DeepCopy()
	c.ResourceVersion, c.UID = "", ""
	b, err := json.Marshal(c)
	if err != nil {
		return "", "", "", fmt.Errorf("writing lock row %q: %w", l.Name, err)
	}
	if c.Spec.HolderIdentity != nil {
		holder = *c.Spec.HolderIdentity
	}
	return string(b), c.Labels[lock.LabelRelease], holder, nil
}

func (k *locks) Get(ctx context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	var object, uid string
	var version int64
	err = k.s.db.QueryRowContext(ctx, `SELECT object, version, uid FROM `+n.locks+` WHERE namespace = $1 AND name = $2`, k.ns, name).Scan(&object, &version, &uid)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierrors.NewNotFound(leaseResource, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lock row %q in namespace %q: %w", name, k.ns, err)
	}
	return decodeLease(name, object, version, uid)
}

// prepare is a write's start: the schema's names and what the row stores
// of l.
func (k *locks) prepare(ctx context.Context, l *coordinationv1.Lease) (n names, object, release, holder string, err error) {
	if n, err = k.s.schema(ctx); err != nil {
		return names{}, "", "", "", err
	}
	object, release, holder, err = encodeLease(l)
	return n, object, release, holder, err
}

func (k *locks) Create(ctx context.Context, l *coordinationv1.Lease, _ metav1.CreateOptions) (*coordinationv1.Lease, error) {
	n, object, release, holder, err := k.prepare(ctx, l)
	if err != nil {
		return nil, err
	}
	uid := uuid.NewString()
	var version int64
	err = k.s.db.QueryRowContext(ctx, `INSERT INTO `+n.locks+` (namespace, name, release, holder, version, uid, object)
		VALUES ($1, $2, $3, $4, nextval($7), $5, $6) ON CONFLICT DO NOTHING RETURNING version`,
		k.ns, l.Name, release, holder, uid, object, n.seq).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierrors.NewAlreadyExists(leaseResource, l.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("creating lock row %q in namespace %q: %w", l.Name, k.ns, err)
	}
	return decodeLease(l.Name, object, version, uid)
}

func (k *locks) Update(ctx context.Context, l *coordinationv1.Lease, _ metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	n, object, release, holder, err := k.prepare(ctx, l)
	if err != nil {
		return nil, err
	}
	want, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("lock row %q: an update needs the version it was read at, not %q", l.Name, l.ResourceVersion))
	}
	var version int64
	var uid string
	err = k.s.db.QueryRowContext(ctx, `UPDATE `+n.locks+` SET release = $3, holder = $4, object = $5, version = nextval($7)
		WHERE namespace = $1 AND name = $2 AND version = $6 RETURNING version, uid`,
		k.ns, l.Name, release, holder, object, want, n.seq).Scan(&version, &uid)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, k.missedWrite(ctx, n, l.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("writing lock row %q in namespace %q: %w", l.Name, k.ns, err)
	}
	return decodeLease(l.Name, object, version, uid)
}

// missedWrite tells why a conditional write matched no row: the row is
// gone (NotFound) or changed since it was read (Conflict).
func (k *locks) missedWrite(ctx context.Context, n names, name string) error {
	var one int
	err := k.s.db.QueryRowContext(ctx, `SELECT 1 FROM `+n.locks+` WHERE namespace = $1 AND name = $2`, k.ns, name).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return apierrors.NewNotFound(leaseResource, name)
	case err != nil:
		return fmt.Errorf("reading lock row %q in namespace %q: %w", name, k.ns, err)
	}
	return apierrors.NewConflict(leaseResource, name, errors.New("the lock row changed since it was read"))
}

func (k *locks) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	n, err := k.s.schema(ctx)
	if err != nil {
		return err
	}
	q := `DELETE FROM ` + n.locks + ` WHERE namespace = $1 AND name = $2`
	args := []any{k.ns, name}
	if p := opts.Preconditions; p != nil {
		if p.ResourceVersion != nil {
			v, err := strconv.ParseInt(*p.ResourceVersion, 10, 64)
			if err != nil {
				return apierrors.NewBadRequest(fmt.Sprintf("lock row %q: precondition version %q", name, *p.ResourceVersion))
			}
			args = append(args, v)
			q += ` AND version = $` + strconv.Itoa(len(args))
		}
		if p.UID != nil {
			args = append(args, string(*p.UID))
			q += ` AND uid = $` + strconv.Itoa(len(args))
		}
	}
	res, err := k.s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("deleting lock row %q in namespace %q: %w", name, k.ns, err)
	}
	if gone, err := res.RowsAffected(); err == nil && gone == 0 {
		return k.missedWrite(ctx, n, name)
	}
	return nil
}

func (k *locks) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	n, err := k.s.schema(ctx)
	if err != nil {
		return nil, err
	}
	sel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("label selector %q: %v", opts.LabelSelector, err))
	}
	q := `SELECT name, object, version, uid FROM ` + n.locks
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
	out := &coordinationv1.LeaseList{}
	for rows.Next() {
		var name, object, uid string
		var version int64
		if err := rows.Scan(&name, &object, &version, &uid); err != nil {
			return nil, fmt.Errorf("listing lock rows %s: %w", lock.InNamespace(k.ns), err)
		}
		l, err := decodeLease(name, object, version, uid)
		if err != nil {
			return nil, err
		}
		if sel.Matches(labels.Set(l.Labels)) {
			out.Items = append(out.Items, *l)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing lock rows %s: %w", lock.InNamespace(k.ns), err)
	}
	return out, nil
}

// Watch is not offered: the lock polls instead (leasestore.LeaseAPI).
func (k *locks) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return nil, apierrors.NewMethodNotSupported(leaseResource, "watch")
}
