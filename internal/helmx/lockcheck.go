// The one check every record write of helm's passes: is the lock on the
// release's newest record still ours (checkLock, newestAllows).

package helmx

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// checkLock reads the lock record on m: own reports whether it is ours,
// and err refuses helm's write when m is the release's newest record (where
// the lock lives) and the lock on it is no longer ours. The lock is taken by
// writing the taker's record onto the newest record, and moves with every
// new revision its holder creates, so while we hold it the newest record
// carries our unreleased record: another session's record there (held or
// since released) means ours was taken over or released after we took it,
// and our own record marked released means a person released it
// (unlock --force). No clock is compared. An older record's lock record is
// stale (the lock moved on) and decides nothing. A newest record with no
// lock record at all was rewritten or written after we took the lock by a
// client that takes none (stock helm's rollback, uninstall or upgrade): our
// lock vanished with it, so the write is refused too, and the lock is never
// carried back onto the release (the holder stops at its next renewal as
// well, lock.Held).
func checkLock(m *metav1.ObjectMeta, g *GuardedWrites, newest bool) (own bool, cur *lock.Record, err error) {
	s, ok := m.Annotations[lock.AnnotationRecord]
	if !ok {
		if !newest {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("helm-autorecover: refused helm's write of release %q in namespace %q: its newest record %s no longer carries our lock: a client that takes no lock (stock helm) wrote it after we took ours: %w",
			g.Release, g.Namespace, m.Name, lock.ErrLost)
	}
	rec, _ := lock.DecodeRecord(s)
	switch {
	case rec == nil:
		if !newest {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("helm-autorecover: refused helm's write of %s: the lock record on the release's newest record is unreadable: %w", m.Name, lock.ErrLost)
	case !newest:
		return rec.Session == g.Lock.Session(), rec, nil
	case rec.Session == g.Lock.Session() && !rec.ReleasedAt.IsZero():
		return false, rec, fmt.Errorf("helm-autorecover: refused helm's write of %s of release %q in namespace %q: its lock was released%s: %w",
			m.Name, g.Release, g.Namespace, releasedBy(rec), lock.ErrLost)
	case rec.Session == g.Lock.Session():
		return true, rec, nil
	}
	state := "holds"
	if !rec.ReleasedAt.IsZero() {
		state = "took and released"
	}
	return false, rec, fmt.Errorf("helm-autorecover: refused helm's write of %s of release %q in namespace %q: session %s of %s %s its lock after we took it: %w",
		m.Name, g.Release, g.Namespace, rec.Session, rec.Who, state, lock.ErrLost)
}

func releasedBy(rec *lock.Record) string {
	if rec.ReleasedBy == "" {
		return ""
	}
	return " by " + rec.ReleasedBy
}

// newestAllows refuses a write of helm's when the lock on the release's
// newest record (metas are listed oldest first) is no longer ours; see
// checkLock.
func newestAllows(metas []metav1.ObjectMeta, g *GuardedWrites) error {
	if len(metas) == 0 {
		return nil
	}
	_, _, err := checkLock(&metas[len(metas)-1], g, true)
	return err
}
