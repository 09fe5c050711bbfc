package protocol

import "github.com/helm-autorecover/helm-autorecover/internal/lock"

// The lock's own vocabulary, as the doors use it: they import this package,
// never the lock engine or a store.
type (
	// Operation is the Helm operation a lock protects.
	Operation = lock.Operation
	// Record is a lock record: who holds (or last held) a release's lock,
	// for what, and until when in API server time.
	Record = lock.Record
	// State is a lock judged Free, Live or Expired.
	State = lock.State
	// Status is a lock as read by Inspect and List.
	Status = lock.Status
	// LockedError is the refusal of a lock a live holder has.
	LockedError = lock.LockedError
)

// The operations that take a lock.
const (
	OpInstall   = lock.OpInstall
	OpUpgrade   = lock.OpUpgrade
	OpRollback  = lock.OpRollback
	OpUninstall = lock.OpUninstall
	OpRecover   = lock.OpRecover
)

// The states of a lock.
const (
	Free    = lock.Free
	Live    = lock.Live
	Expired = lock.Expired
)

// Lock limits and margins (see docs/protocol.md).
const (
	DefaultLeaseDuration = lock.DefaultLeaseDuration
	MaxLeaseDuration     = lock.MaxLeaseDuration
	TakeoverMargin       = lock.TakeoverMargin
)

// The errors of a lock.
var (
	ErrLocked  = lock.ErrLocked
	ErrLost    = lock.ErrLost
	ErrMaxHold = lock.ErrMaxHold
)

// Names and identities.
var (
	LeaseName           = lock.LeaseName
	InNamespace         = lock.InNamespace
	ValidateReleaseName = lock.ValidateReleaseName
	NewSession          = lock.NewSession
	DefaultWho          = lock.DefaultWho
	// Found is the holder a take found and its state, an abandoned holder
	// it handed on standing in for it (see lock.Found).
	Found = lock.Found
)
