// Package releasestore keeps each release's lock with helm's own storage
// records, so that every client of the release finds it whatever its
// backend: the gate, the lock record on the release's newest record (a
// Secret or ConfigMap, as helm's driver says), and the beat, a small object
// of the same kind named helm-autorecover.v1.RELEASE that holds the
// holder's renewals and the waiters' queue (see beat.go for the rules that
// keep the two one lock).
//
// It implements lock.Store; the engine (package lock) decides, this
// package only reads and writes. The write fence (package helmx) copies
// the gate onto helm's own record writes (GateRecord).
package releasestore
