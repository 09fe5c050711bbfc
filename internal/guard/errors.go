package guard

// Exit codes of the guarded commands, documented in docs/exit-codes.md.
// Helm's own failures keep exit code 1.
const (
	// ExitUsage: a lock or recovery flag (or its environment variable) is invalid.
	ExitUsage = 2
	// ExitLocked: another live client holds the release's lock (and
	// --lock-timeout, if any, ran out).
	ExitLocked = 3
	// ExitLockLost: this process lost its lock (could not renew before the
	// renew deadline, or found it taken) and stopped before writing again.
	ExitLockLost = 4
	// ExitPending: the release is pending and may not be recovered now (a
	// stock-helm pending revision younger than --recover-legacy-after, or
	// --autorecover=false).
	ExitPending = 5
	// ExitMaxHold: the operation held the lock longer than --lock-max-hold
	// and was aborted; its revision was marked failed.
	ExitMaxHold = 6
	// ExitInterrupted: SIGINT or SIGTERM ended the operation.
	ExitInterrupted = 130
)

// ExitError carries a documented exit code with its cause.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }

func (e *ExitError) Unwrap() error { return e.Err }
