//go:build !linux

package sleepclock

import "time"

// suspendedSampler returns nil: without CLOCK_BOOTTIME the wall clock,
// cross-checked with the monotonic one, counts the time spent suspended.
func suspendedSampler() func() (time.Duration, bool) { return nil }
