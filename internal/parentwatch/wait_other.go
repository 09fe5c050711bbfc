//go:build !linux

package parentwatch

import "errors"

// waitExit has no process handle to wait on outside Linux: the caller
// reads getppid instead.
func waitExit(int) error {
	return errors.New("no pidfd on this system")
}
