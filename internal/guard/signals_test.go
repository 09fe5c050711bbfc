package guard

import (
	"testing"
	"time"
)

// TestIsSecondSignal: after a first SIGINT or SIGTERM any signal is a
// second one; after the end of helm (the plugin's parent), a signal within
// groupSignalWindow is the same process-group signal that ended helm (seen
// in the other order), not a second one: the release is still marked
// failed and its lock released (e2e TestPluginParentSignalled, SIGINT to the
// process group, failed when the end of helm was seen first).
func TestIsSecondSignal(t *testing.T) {
	for _, c := range []struct {
		parent bool
		since  time.Duration
		want   bool
	}{
		{false, 0, true},
		{false, 10 * time.Millisecond, true},
		{true, 0, false},
		{true, groupSignalWindow - time.Millisecond, false},
		{true, groupSignalWindow, true},
		{true, time.Minute, true},
	} {
		if got := isSecondSignal(c.parent, c.since); got != c.want {
			t.Errorf("isSecondSignal(parent %v, after %s) = %v, want %v", c.parent, c.since, got, c.want)
		}
	}
}
