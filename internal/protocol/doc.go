// Package protocol is the one implementation of helm-autorecover's protocol
// that every entry point runs: the guarded helm commands, the lock commands
// (locks, unlock, recover), pkg/autorecover and the controller.
//
// A Conn is one connection to a cluster: a client whose responses feed an
// estimate of the API server's clock, helm's release records for the storage
// driver in use, and the choice of lock backend (Stores: the release
// record's lock first, then the Lease when that backend is chosen, auto by
// the caller's rights on Leases). Take is the one place a lock request is
// built: it takes the lock in those stores under one session and arms the
// lock's write fence; the Lock it returns knows what it was taken from, and
// Lock.Run is the one guarded sequence around a helm operation. Reader reads
// locks as the lock commands do.
//
// Recover is the one recovery procedure: read the history and the server's
// clock, decide (recovery.Decide, with the lock mapped by recovery's one
// mapping), undo what an abandoned revision applied, mark it failed with
// writes conditional on the resourceVersion read, roll back when asked, and
// read and decide again on a conflict. Lock.Release hands an expired holder
// on when its revision was not recovered, so the next client recovers it
// at once.
package protocol
