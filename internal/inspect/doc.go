// Package inspect turns what was read about releases and their locks into
// what the locks, list --locks and recover commands print. It reads nothing
// and writes nothing: every function takes the lock statuses, release
// summaries and API-server time it needs, so its output is deterministic and
// tested with golden files.
//
// A lock is shown in one of four states (State): live, expired,
// legacy-pending (the release is pending and no lock covers it: stock helm
// wrote it, or its holder released the lock without resolving it) and none.
package inspect
