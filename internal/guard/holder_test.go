package guard

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// TestHolderNotRunningHere: a holder of this host whose pid has exited is
// not running; a running one, one of another host, or one with no pid is
// never called dead.
func TestHolderNotRunningHere(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("processGone cannot tell on windows: the hint is not given there")
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	running := exec.Command("sleep", "600")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Process.Kill(); _ = running.Wait() })
	for _, tc := range []struct {
		name string
		rec  *lock.Record
		want bool
	}{
		{"exited here", &lock.Record{Who: "ci@" + host, PID: exited.Process.Pid}, true},
		{"running here", &lock.Record{Who: "ci@" + host, PID: running.Process.Pid}, false},
		{"this process", &lock.Record{Who: "ci@" + host, PID: os.Getpid()}, false},
		{"other host", &lock.Record{Who: "ci@" + host + "-other", PID: exited.Process.Pid}, false},
		{"no pid", &lock.Record{Who: "ci@" + host}, false},
		{"no record", nil, false},
	} {
		if got := holderNotRunningHere(tc.rec); got != tc.want {
			t.Errorf("%s: holderNotRunningHere = %v, want %v", tc.name, got, tc.want)
		}
	}
}
