package recovery

import (
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// This file is the one mapping from lock records to Decide's input. Every
// entry point (the guard, the lock commands, pkg/autorecover, the
// controller) goes through it, so they attribute a pending revision alike.

// FromRecord maps a lock record found in state onto the decision's input; a
// nil record means no lock record at all (LockNone).
//
// Attribution rule: when the record names the revision its holder was
// writing (Revision > 0), AcquiredAt is dropped. The record's AcquiredAt is
// an upper bound of server time (up to the Date header's second plus a
// round trip late), while rule 4 of Decide needs a lower bound: a revision
// created in the same server second as the acquisition would be judged
// "written before the lock" and left pending as legacy. A holder records
// its revision only after reading the history under the lock and finding
// nothing pending (or recovering it), so a pending write on that revision
// happened after the acquisition; the check adds nothing there.
func FromRecord(rec *lock.Record, state LockState) LockInfo {
	if rec == nil {
		return LockInfo{State: LockNone}
	}
	info := LockInfo{
		State:      state,
		Session:    rec.Session,
		Who:        rec.Who,
		Operation:  string(rec.Operation),
		Revision:   rec.Revision,
		AcquiredAt: rec.AcquiredAt,
		LockedTill: rec.LockedTill,
		Stopped:    rec.Stopped,
	}
	if rec.Revision > 0 {
		info.AcquiredAt = time.Time{}
	}
	return info
}

// PreviousLock maps what a client found when it took the lock (the record
// and state of lock.Held.Previous) onto the decision's input: an Expired
// holder's record is LockExpired, any other record LockReleased (a holder
// that releases resolves its own revision first), none LockNone. A record
// released by a holder that failed to recover an expired holder's revision
// stands for that expired holder (lock.Found).
func PreviousLock(prev *lock.Record, found lock.State) LockInfo {
	p, st := lock.Found(prev, found)
	if p == nil {
		return LockInfo{State: LockNone}
	}
	state := LockReleased
	if st == lock.Expired {
		state = LockExpired
	}
	// Stopped comes from the record alone: lock.HandedOn marks the
	// holder a taker found Expired itself (lock.Held.Previous passes
	// its copy here).
	return FromRecord(p, state)
}

// ObservedLock maps a lock read without taking it (lock.Status) onto the
// decision's input: what a client taking the lock now would find, or
// LockLive while someone holds it. A live or expired holder whose record is
// unreadable or belongs to another session is known by its session and
// LOCKED TILL alone.
func ObservedLock(st *lock.Status) LockInfo {
	if st == nil || !st.Exists {
		return LockInfo{State: LockNone}
	}
	rec := st.Record
	if st.RecordErr != nil {
		rec = nil
	}
	if st.HolderIdentity == "" {
		return PreviousLock(rec, lock.Free)
	}
	state := LockLive
	if st.State == lock.Expired && !st.Confirming {
		// An expiry this process has not confirmed on its own clock yet
		// (lock.Confirm) is planned for as a live holder: a take would
		// wait for it, and may find the holder renewing.
		state = LockExpired
	}
	// An expiry confirmed here (above) means the holder stopped.
	if rec == nil || rec.Session != st.HolderIdentity {
		return LockInfo{State: state, Session: st.HolderIdentity, LockedTill: st.LockedTill, Stopped: state == LockExpired}
	}
	info := FromRecord(rec, state)
	info.LockedTill = st.LockedTill
	info.Stopped = state == LockExpired
	return info
}
