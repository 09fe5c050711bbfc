//go:build linux

package sleepclock

import (
	"time"

	"golang.org/x/sys/unix"
)

// sampleJitter is the most a sample of the suspended total may be
// uncertain by: the time between the two CLOCK_MONOTONIC readings that
// enclose the CLOCK_BOOTTIME one.
const sampleJitter = 50 * time.Microsecond

// suspendedSampler returns how long the machine has been suspended since
// boot: CLOCK_BOOTTIME less CLOCK_MONOTONIC (Go's monotonic clock). It
// returns nil when the kernel has no CLOCK_BOOTTIME.
func suspendedSampler() func() (time.Duration, bool) {
	if _, err := read(unix.CLOCK_BOOTTIME); err != nil {
		return nil
	}
	return func() (time.Duration, bool) {
		for i := 0; ; i++ {
			m1, err1 := read(unix.CLOCK_MONOTONIC)
			b, err2 := read(unix.CLOCK_BOOTTIME)
			m2, err3 := read(unix.CLOCK_MONOTONIC)
			if err1 != nil || err2 != nil || err3 != nil {
				return 0, false
			}
			// The boot time was read between m1 and m2: b-m2 is short of
			// the suspended total by at most m2-m1.
			if m2-m1 <= sampleJitter || i == maxTries {
				return max(b-m2, 0), true
			}
		}
	}
}

func read(id int32) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
