//go:build chaos && linux

package chaos

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// stopThisThread stops the process (SIGSTOP) and returns once it was
// continued. The signal is sent to the calling thread: one sent to the
// process may be taken by another thread, and the caller run on for a
// moment before the whole process stops.
func stopThisThread() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}
