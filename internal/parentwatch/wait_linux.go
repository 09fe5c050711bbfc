package parentwatch

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// waitExit blocks until the process ppid, this process's parent, has
// ended, waiting on a pidfd (Linux 5.3+). It returns an error, at once,
// when no pidfd can be opened or polled, and the caller falls back to
// reading getppid.
func waitExit(ppid int) error {
	fd, err := unix.PidfdOpen(ppid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // already gone
	}
	if err != nil {
		return fmt.Errorf("pidfd_open(%d): %w", ppid, err)
	}
	defer func() { _ = unix.Close(fd) }()
	// The parent may have ended before the pidfd was opened, and its pid
	// been given to another process since: then getppid names a reaper.
	if os.Getppid() != ppid {
		return nil
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll on the pidfd of %d: %w", ppid, err)
		}
		if n > 0 {
			return nil // readable: the process has ended
		}
	}
}
