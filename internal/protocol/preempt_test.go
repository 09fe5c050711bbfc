package protocol

import (
	"errors"
	"fmt"
	"testing"
)

// TestPreemptible: helm cancels its install and upgrade, so a holder of
// one stops when a waiter asks; it cancels neither a rollback nor an
// uninstall (an uninstall stopped half-way leaves some of the release's
// objects deleted and others not), nor is a recovery stopped: those say
// why, and the waiter keeps waiting.
func TestPreemptible(t *testing.T) {
	for _, tc := range []struct {
		op  Operation
		ok  bool
		why string
	}{
		{OpInstall, true, ""},
		{OpUpgrade, true, ""},
		{OpRollback, false, "helm cannot cancel a rollback"},
		{OpUninstall, false, "helm cannot cancel an uninstall"},
		{OpRecover, false, "a recover is not stopped at a waiter's request"},
	} {
		t.Run(string(tc.op), func(t *testing.T) {
			ok, why := Preemptible(tc.op)
			if ok != tc.ok || why != tc.why {
				t.Errorf("Preemptible(%q) = %v, %q; want %v, %q", tc.op, ok, why, tc.ok, tc.why)
			}
		})
	}
}

// TestPreemptedErrorNamesTheAsker: the end of a preempted operation names
// the release, the namespace and who asked, and is ErrPreempted for
// errors.Is, however it is wrapped.
func TestPreemptedErrorNamesTheAsker(t *testing.T) {
	for _, tc := range []struct {
		by   Waiter
		want string
	}{
		{Waiter{Session: "s-2", Who: "bob@laptop", Operation: OpUpgrade}, `release "web" in namespace "shop": stopped at the request of bob@laptop (session s-2, waiting to upgrade) (--preempt)`},
		{Waiter{Session: "s-3", Who: "ci@runner"}, `release "web" in namespace "shop": stopped at the request of ci@runner (session s-3) (--preempt)`},
		{Waiter{Session: "s-4"}, `release "web" in namespace "shop": stopped at the request of an unnamed client (session s-4) (--preempt)`},
	} {
		err := fmt.Errorf("upgrade: %w", &PreemptedError{Release: "web", Namespace: "shop", By: tc.by})
		if got := errors.Unwrap(err).Error(); got != tc.want {
			t.Errorf("error %q; want %q", got, tc.want)
		}
		if !errors.Is(err, ErrPreempted) {
			t.Errorf("errors.Is(%v, ErrPreempted) = false", err)
		}
		if p, ok := errors.AsType[*PreemptedError](err); !ok || p.By != tc.by {
			t.Errorf("errors.AsType = %+v, %v; want the request of %+v", p, ok, tc.by)
		}
	}
}
