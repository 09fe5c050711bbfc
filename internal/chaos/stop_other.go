//go:build chaos && !linux

package chaos

import (
	"os"
	"syscall"
)

// stopThisThread stops the process (SIGSTOP) and returns once it was
// continued; the caller may run on for a moment before it stops.
func stopThisThread() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}
