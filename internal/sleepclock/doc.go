// Package sleepclock measures elapsed local time across system sleep.
//
// Go's monotonic clock, which time.Now attaches to every reading and which
// runs every timer, stops while the machine is suspended (Linux's
// CLOCK_MONOTONIC, macOS's mach_absolute_time, Windows' unbiased interrupt
// time). A lock holder whose laptop slept past its lease would wake believing
// no time had passed, its lock still valid, and write. The wall clock counts
// sleep but can be stepped either way at any moment.
//
// A Meter therefore answers with two estimates of the time between two
// readings, lo <= hi: lo never counts time the machine may not have been
// running, hi counts all of it. Callers that must not act too early (the
// lower bound of the API server's clock, which decides when another holder's
// lock has expired) use lo; callers that must stop in time (the upper bound
// of the server's clock, a holder's own renew deadline) use hi. Elapsed
// answers for any clock: a clock that is not a Meter, like the fake clocks
// of k8s.io/utils/clock/testing, gives lo == hi == b.Sub(a).
//
// System returns the process's real clock. Its readings are time.Now's (wall
// and monotonic), so code that compares or subtracts them as usual keeps
// measuring monotonic time, and timers are clock.RealClock's. Its Elapsed
// adds, for hi, the time spent suspended between the readings:
//
//   - On Linux, from CLOCK_BOOTTIME, which counts suspension, less
//     CLOCK_MONOTONIC, which does not; each reading notes the total
//     suspended so far. lo is the monotonic elapsed time alone, since the
//     kernel injects the length of a suspension from a clock that can be a
//     second off. A stepped wall clock changes neither.
//   - Elsewhere (or where CLOCK_BOOTTIME is unavailable), from the wall
//     clock, cross-checked with the monotonic one: lo is the smaller of the
//     two elapsed times and hi the larger, so a wall clock stepped forward
//     makes a holder stop early but never makes another holder's lock
//     expire sooner, and one stepped back changes nothing beyond what the
//     monotonic clock says.
//
// Fake is a fake clock for tests whose machine can be suspended: its
// readings (standing for the monotonic clock) and its timers stand still
// while its sleep-counting clock jumps ahead.
package sleepclock
