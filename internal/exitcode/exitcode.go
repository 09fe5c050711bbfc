// Package exitcode defines every exit code of helm-autorecover's commands,
// documented in docs/exit-codes.md, and the error that carries one. helm's
// own failures keep helm's code (1).
package exitcode

// The exit codes.
const (
	// OK: success.
	OK = 0
	// Failure: helm failed (chart, values, cluster errors...), as stock helm.
	Failure = 1
	// Usage: a lock or recovery flag (or its environment variable), or an
	// argument of a lock command, is invalid.
	Usage = 2
	// Locked: another live client holds the release's lock (and
	// --lock-timeout, if any, ran out).
	Locked = 3
	// LockLost: this process lost its lock (could not renew before the
	// renew deadline, or found it taken) and stopped before writing again.
	LockLost = 4
	// Pending: the release is pending and may not be recovered now (a
	// stock-helm pending revision younger than --recover-legacy-after, or
	// --autorecover=false).
	Pending = 5
	// MaxHold: the operation held the lock longer than --lock-max-hold and
	// was aborted; its revision was marked failed.
	MaxHold = 6
	// NotFound: the release is unknown (no stored revision and no lock),
	// has no stored revision, or has no lock to release.
	NotFound = 7
	// WrongSession: --session does not name the lock's holder; the message
	// names the holder's session.
	WrongSession = 8
	// BadLock: the release's Lease or lock record cannot be trusted
	// (unreadable, written by a newer or foreign tool, edited by hand).
	BadLock = 9
	// Declined: a forced unlock of a live lock was not confirmed.
	Declined = 10
	// Preempted: the operation was stopped at the request of a newer one
	// (--preempt); its revision was marked failed and its lock given back.
	Preempted = 11
	// Interrupted: SIGINT or SIGTERM ended the operation.
	Interrupted = 130
)

// Error carries a documented exit code with its cause.
type Error struct {
	Code int
	Err  error
	// Reported is set when the command has already told the user what Err
	// says (a report on stdout): the error is not printed again.
	Reported bool
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }
