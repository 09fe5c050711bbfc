// Package guard puts the release lock and automatic recovery around helm's
// install, upgrade, rollback and uninstall: take the lock (or wait for it),
// recover a release its previous holder abandoned, record which revision is
// being written, keep the lock renewed while helm works (stopping the
// process if it cannot), honour signals, and give the lock back.
package guard
