package recovery

import (
	"errors"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

func TestLockMapping(t *testing.T) {
	acquired := time.Date(2026, 12, 3, 10, 0, 0, 500_000_000, time.UTC)
	till := acquired.Add(15 * time.Second)
	rec := func(rev int) *lock.Record {
		return &lock.Record{Schema: lock.SchemaVersion, Session: "s1", Who: "alice@ci", Operation: lock.OpUpgrade, Revision: rev, AcquiredAt: acquired, LockedTill: till}
	}
	released := func(r *lock.Record, abandoned *lock.Record) *lock.Record {
		r.ReleasedAt = till
		r.Abandoned = abandoned
		return r
	}
	stopped := func(r *lock.Record) *lock.Record {
		r.Stopped = true
		return r
	}
	cases := []struct {
		name string
		got  LockInfo
		want LockInfo
	}{
		{"no record", FromRecord(nil, LockExpired), LockInfo{State: LockNone}},
		{
			"revision unknown keeps AcquiredAt", FromRecord(rec(0), LockExpired),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", AcquiredAt: acquired, LockedTill: till},
		},
		{
			"revision named drops AcquiredAt", FromRecord(rec(4), LockExpired),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till},
		},
		{
			"taken from an expired holder (as lock.Held.Previous hands it on)", PreviousLock(lock.HandedOn(rec(4), lock.Expired), lock.Expired),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till, Stopped: true},
		},
		{
			"taken from a released holder", PreviousLock(released(rec(4), nil), lock.Free),
			LockInfo{State: LockReleased, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till},
		},
		{
			"released naming an abandoned holder stands for it", PreviousLock(released(&lock.Record{Schema: lock.SchemaVersion, Session: "s2"}, rec(4)), lock.Free),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till},
		},
		{
			"died recovering a holder a person released: it may still write", PreviousLock(&lock.Record{Schema: lock.SchemaVersion, Session: "s3", Abandoned: rec(4)}, lock.Expired),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till},
		},
		{
			"died recovering a holder taken over after its expiry: it stopped", PreviousLock(&lock.Record{Schema: lock.SchemaVersion, Session: "s3", Abandoned: stopped(rec(4))}, lock.Expired),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till, Stopped: true},
		},
		{"nothing found", PreviousLock(nil, lock.Free), LockInfo{State: LockNone}},
		{"observed: no lock", ObservedLock(&lock.Status{}), LockInfo{State: LockNone}},
		{
			"observed: live", ObservedLock(&lock.Status{Exists: true, State: lock.Live, HolderIdentity: "s1", Record: rec(4), LockedTill: till.Add(time.Second)}),
			LockInfo{State: LockLive, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till.Add(time.Second)},
		},
		{
			"observed: expired", ObservedLock(&lock.Status{Exists: true, State: lock.Expired, HolderIdentity: "s1", Record: rec(0), LockedTill: till}),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", AcquiredAt: acquired, LockedTill: till, Stopped: true},
		},
		{
			"observed: live, record of another session", ObservedLock(&lock.Status{Exists: true, State: lock.Live, HolderIdentity: "s9", Record: rec(4), LockedTill: till}),
			LockInfo{State: LockLive, Session: "s9", LockedTill: till},
		},
		{
			"observed: live, record unreadable", ObservedLock(&lock.Status{Exists: true, State: lock.Live, HolderIdentity: "s1", Record: rec(4), RecordErr: errors.New("bad"), LockedTill: till}),
			LockInfo{State: LockLive, Session: "s1", LockedTill: till},
		},
		{
			"observed: released", ObservedLock(&lock.Status{Exists: true, State: lock.Free, Record: released(rec(4), nil)}),
			LockInfo{State: LockReleased, Session: "s1", Who: "alice@ci", Operation: "upgrade", Revision: 4, LockedTill: till},
		},
		{
			"observed: released, handing on", ObservedLock(&lock.Status{Exists: true, State: lock.Free, Record: released(&lock.Record{Schema: lock.SchemaVersion, Session: "s2"}, rec(0))}),
			LockInfo{State: LockExpired, Session: "s1", Who: "alice@ci", Operation: "upgrade", AcquiredAt: acquired, LockedTill: till},
		},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s:\n got  %+v\n want %+v", c.name, c.got, c.want)
		}
	}
}
