// Package sim is the deterministic simulation of helm-autorecover's protocol
// (issue 17): several clients run the real core (pkg/autorecover's Run, so
// the lock, the server-time estimate, Confirm, the recovery decision and
// the write fence) against Model, an in-process model of the parts of the
// Kubernetes API server the protocol touches, inside a testing/synctest
// bubble, so that a schedule of minutes of lease time runs in milliseconds
// of virtual time.
//
// A Schedule, drawn from a seed (Draw) or enumerated (Exhaustive), says
// which clients run which helm operation when, with which lease and lock
// backend, and what goes wrong for each: a crash at its n-th request (the
// process is gone: nothing it has not yet sent is sent), a pause longer
// than its lease (SIGSTOP), a system sleep (its monotonic clock stops), a
// wall clock off by up to ten minutes, a Date header shifted on its path;
// and for the schedule, the latency of every request and the share of
// requests that are reset, answered 409, 429 or 5xx, or committed with
// their answer lost. A client that waits may ask the holder to stop
// (cooperative preemption, issue 34: Plan.Preempt), and an install or
// upgrade may run a hook of the chart (Plan.Hook), during which its holder
// declines to.
//
// The "helm" of a simulated client is not helm's action code: it writes
// the release records in the order helm 4's install, upgrade, rollback and
// uninstall write them, through helm's own storage driver on the fenced
// configuration Run hands it, and it ignores the failure of the write that
// marks the previous revision superseded, as helm does; an install or
// upgrade whose context ends marks its revision failed and writes nothing
// else. Charts render one object (a ConfigMap, and one more as a hook's
// resource when the plan runs a hook), applied through the same fence.
//
// Check reads the model's own history of committed writes and reports
// every violation of the invariants of docs/protocol.md it can see (S1,
// S2, S3, S5, S7); Run runs one schedule and checks it.
package sim
