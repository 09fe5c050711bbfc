// Package leasestore keeps each release's lock in a coordination.k8s.io/v1
// Lease of the release's namespace (helm-autorecover.v1.RELEASE): the lock
// record in the annotation lock.AnnotationRecord, mirrored in the Lease's
// spec for tools that read Leases alone, and the waiters' queue in
// lock.AnnotationQueue. Every write is an update conditional on the Lease
// as read.
//
// It implements lock.Store; the engine (package lock) decides, this
// package only reads and writes.
package leasestore
