package guard

import (
	"errors"
	"fmt"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// TestLockErrorCodes: a failure to take the lock gets its documented exit
// code: 3 when someone holds it, 4 when a part taken first was lost while
// a later one was taken (docs/exit-codes.md), and the error names the
// release and its namespace.
func TestLockErrorCodes(t *testing.T) {
	target := Target{Release: "web", Namespace: "prod"}
	for _, c := range []struct {
		name string
		err  error
		code int
	}{
		{"held by someone live", &lock.LockedError{Release: "web", Namespace: "prod", State: lock.Live}, exitcode.Locked},
		{"a part lost while the next was taken", fmt.Errorf("lock on release %q was not renewed before its renew deadline; stop writing: %w", "web", lock.ErrLost), exitcode.LockLost},
		{"a backend that cannot be used", &protocol.BackendError{Choice: "lease", Err: errors.New("lock backend lease: helm's memory driver keeps no record")}, exitcode.Usage},
	} {
		err := lockError(c.err, target, "lease")
		var coded *exitcode.Error
		if !errors.As(err, &coded) || coded.Code != c.code {
			t.Errorf("%s: %v, want exit code %d", c.name, err, c.code)
			continue
		}
		if msg := err.Error(); c.code == exitcode.LockLost && msg != `release "web" in namespace "prod": `+c.err.Error() {
			t.Errorf("%s: message %q does not name the release and namespace first", c.name, msg)
		}
	}
}
