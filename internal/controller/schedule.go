package controller

import (
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// minRequeue keeps a release judged at the edge of its expiry from being
// looked at again in a tight loop.
const minRequeue = 250 * time.Millisecond

// Observation is what the controller knows of a pending release when it
// decides what to do next.
type Observation struct {
	// Ignored is set when the release or its namespace opted out.
	Ignored bool
	// Decision is recovery.Decide's verdict on the lock as observed.
	Decision recovery.Decision
	// Live is set when a live holder has the release's lock; LockedTill is
	// its LOCKED TILL and Margin the takeover margin, in server time.
	Live       bool
	LockedTill time.Time
	Margin     time.Duration
	// NowEarliest is the earliest the API server's clock can read now.
	NowEarliest time.Time
	// ConfirmIn, when set, is how long until the controller's own clock
	// judges the lock expired unless it changes (lock.Confirm): sooner than
	// LOCKED TILL when the server's clock runs behind, later when LOCKED
	// TILL has passed but too recently to be confirmed.
	ConfirmIn time.Duration
}

// Step is what the controller does next with a release.
type Step struct {
	// Recover: take the lock and recover the release now.
	Recover bool
	// After: look again after this long; 0 waits for a change of the
	// release's records (or none is needed).
	After time.Duration
	// Why says so, for the log.
	Why string
}

// Next decides the controller's next step from an observation.
func Next(o Observation) Step {
	d := o.Decision
	switch {
	case o.Ignored:
		return Step{Why: "opted out (annotation helm-autorecover.io/ignore)"}
	case d.Verdict == recovery.Recover || d.Verdict == recovery.RecoverThenRollback:
		return Step{Recover: true, Why: d.Reason}
	case d.Verdict != recovery.Blocked:
		return Step{Why: d.Reason} // not pending, or nothing to do
	case o.Live && !o.LockedTill.IsZero():
		// Judged again once its LOCKED TILL has passed: a holder that
		// renews meanwhile is seen live then and looked at later again.
		wait := o.LockedTill.Add(o.Margin).Sub(o.NowEarliest)
		if o.ConfirmIn > 0 && (wait <= 0 || o.ConfirmIn < wait) {
			wait = o.ConfirmIn
		}
		return Step{After: max(wait, minRequeue), Why: d.Reason}
	case d.RetryAfter > 0:
		return Step{After: max(d.RetryAfter, minRequeue), Why: d.Reason}
	}
	// Blocked for a reason time does not change (--recover-legacy-after=0,
	// an age that cannot be told): a change of the records brings it back.
	return Step{Why: d.Reason}
}
