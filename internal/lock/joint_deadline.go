package lock

import (
	"context"
	"errors"
	"time"
)

// Deadline is the earliest renew deadline of the parts (Held.Deadline), on
// the lock's injected local clock: unless a renewal succeeds first, the lock
// must be considered lost from then on, so no write made under it may still
// be in flight then.
func (j *Joint) Deadline() time.Time {
	var d time.Time
	for _, h := range j.parts {
		if hd := h.Deadline(); d.IsZero() || hd.Before(d) {
			d = hd
		}
	}
	return d
}

// ReleaseAbandoning gives every part back, the last taken first, with a
// record naming abandoned (see Held.ReleaseAbandoning): the next client
// treats abandoned as an expired holder and recovers the revision it names
// at once. A holder passes its own record when it cannot resolve a revision
// of its own that helm left pending.
func (j *Joint) ReleaseAbandoning(ctx context.Context, abandoned *Record) error {
	var errs []error
	for i := len(j.parts) - 1; i >= 0; i-- {
		errs = append(errs, j.parts[i].ReleaseAbandoning(ctx, abandoned))
	}
	return errors.Join(errs...)
}
