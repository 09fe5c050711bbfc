// Package lock owns the per-release lock, in three parts:
//
//   - the core, with no I/O: the record (a versioned JSON schema that says
//     who holds a release, for which operation, and until when in API server
//     time), Judge and Confirm, which judge a lock Free, Live or Expired, and
//     the waiters' arrival order (record.go, judge.go, name.go, errors.go);
//   - the engine (Backend, Acquire, Held): it takes, renews, waits for,
//     keeps and releases a lock over one or more stores, in order (lease.go,
//     wait.go, held.go, part.go, quiet.go, asks.go, sighting.go);
//   - the stores, behind the Store interface (store.go): each reads a lock
//     into a typed Snapshot and writes it conditionally on one, saying what
//     it writes (take, renew, enqueue, release). They live in packages of
//     their own, which import this one: a Lease per release (package
//     leasestore), the release's own records, the gate on the newest
//     record and the beat object (package releasestore), and a row per
//     release in helm's sql database (package sqlstore). The engine never reads a store's objects: a store
//     reads them for it (Store.Change, Renewal, Written).
//
// # The Lease
//
// One Lease per release lives in the release's namespace, named by LeaseName.
// Its spec mirrors the record for tools that only understand Leases:
// holderIdentity is the session ID (empty once released), renewTime and
// leaseDurationSeconds give the expiry. The full record is JSON in the
// annotation AnnotationRecord; waiters queue in AnnotationQueue.
//
// # Time
//
// Every time written into a record is an upper bound of the API server's
// clock at the moment the write was sent (see package servertime), and
// lockedTill = renewedAt + leaseDuration. A reader declares a lock expired only
// when the lower bound of its own server-time estimate has passed lockedTill
// plus a margin (TakeoverMargin, 250 ms). The holder, for its part, treats the
// lock as lost once its local monotonic clock reaches the send time of its last
// successful renewal plus leaseDuration minus RenewMargin (1 s), its renew
// deadline. Between the holder's last write and a takeover there are thus at
// least 1.25 s of server time: the renew margin covers the delay between a
// check and the write it guards, the takeover margin a local clock rate
// adjusted beyond the bounds' drift allowance. No decision
// compares one client's clock with another's.
//
// # Writes
//
// Every write to the Lease is conditional on the resourceVersion last read
// (Create for a missing Lease, Update carrying resourceVersion, Delete with a
// resourceVersion precondition). On a conflict the Lease is read again and the
// decision is made again; nothing is ever overwritten blindly. A take, a
// renewal and a revision write are each held to their renew deadline: every
// write request they send is checked against it right before it leaves (a
// store that reads before it writes, such as the release store, checks
// between the two), and its context ends at it, so no request is sent or
// retried after it. A take stopped so reads the lock again; a holder stops.
// Only a release, conditional on this session still holding the lock, may
// be sent after the deadline.
//
// # Residual risk
//
// A holder process that is paused (SIGSTOP, a frozen VM, swap storm) for longer
// than its lease can wake up after another client took the lock over and issue
// one write it believes safe, because the check and the write are not atomic.
// part.Valid narrows that window to the time between a check and a write;
// resourceVersion preconditions on the release's own records, done by the
// caller, close it for those records.
package lock
