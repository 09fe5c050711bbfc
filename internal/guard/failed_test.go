package guard

import (
	"errors"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// TestFailedSaysOnlyWhatIsTrue: the line after helm's own error claims
// nothing about a revision it cannot know (issue 35 item 6: after a --wait
// timeout or a SIGTERM helm has marked its revision failed already, and the
// line said the next operation would recover it), and says where to look.
func TestFailedSaysOnlyWhatIsTrue(t *testing.T) {
	r := &run{t: Target{Op: lock.OpUpgrade, Release: "web", Namespace: "shop"}}
	err := r.failed(errors.New("UPGRADE FAILED: context deadline exceeded"))
	want := "UPGRADE FAILED: context deadline exceeded\n" +
		`helm-autorecover: the upgrade of release "web" in namespace "shop" failed (above); this command gives the release's lock back as it ends; see where the release stands with: helm history web -n shop`
	if err.Error() != want {
		t.Errorf("got:\n%s\nwant:\n%s", err, want)
	}
	if strings.Contains(err.Error(), "recovers") {
		t.Errorf("the line promises a recovery it cannot know of: %s", err)
	}
}
