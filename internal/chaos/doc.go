// Package chaos holds the fault-injection hooks of test builds (make chaos,
// hack/chaos). Built with the "chaos" tag, the hooks read the process's
// environment and act on it:
//
//   - HELM_AUTORECOVER_CHAOS_KILL_AT=POINT[#N] sends the process SIGKILL
//     the Nth time (default the first) it reaches the named point;
//   - HELM_AUTORECOVER_CHAOS_STOP_AT=POINT[#N] sends it SIGSTOP there
//     instead (whoever runs it sends SIGCONT);
//   - HELM_AUTORECOVER_CHAOS_LOG=FILE appends a line "POINT PID" for every
//     point reached, before acting on it;
//   - HELM_AUTORECOVER_CHAOS_CLOCK_OFFSET=DURATION shifts every wall-clock
//     reading the tool makes (sleepclock.System, and helm's own timestamps
//     through action.Timestamper) by DURATION: Go reads time without libc,
//     so a skewed machine is simulated inside the process.
//   - HELM_AUTORECOVER_CHAOS_SUSPEND_AT=POINT[#N]:DURATION simulates a
//     system sleep there: the process sends itself SIGSTOP and, once
//     continued, sleepclock's sampler of the time the machine spent
//     suspended (CLOCK_BOOTTIME less CLOCK_MONOTONIC) reports DURATION
//     more. CLOCK_MONOTONIC keeps running while a process is stopped, so
//     the readings also show however long it was held: a runner that
//     continues it at once tests the boot-time reading alone.
//   - HELM_AUTORECOVER_CHAOS_FREEZE_AT=POINT[#N] simulates a virtual
//     machine stopped and resumed there (or a memory snapshot, a CRIU
//     image restored): the process sends itself SIGSTOP and, once
//     continued, every reading of sleepclock.System (the lock's and the
//     server-time estimator's clock) is taken back by the time it was held,
//     so its monotonic and boot-time readings alike say no time passed,
//     while the API server's clock went on. Go's own timers still run on
//     the kernel's monotonic clock: those due while it was held fire once
//     it is continued (a real stopped VM's would not), and find no time
//     passed on the clock they read.
//
// Without the tag (every release build) Enabled is false, every hook is an
// empty function and the calls compile away: no environment is read.
//
// The points, in the order an operation reaches them:
//
//	before-lock          the guard starts, nothing taken yet
//	after-lock           the lock is taken, recovery not yet run
//	recovery             recovery marked an abandoned revision failed
//	after-pending-write  helm wrote its pending record (or uninstalling)
//	pre-hook             helm created a pre-* hook object
//	apply                helm wrote its first object of the chart
//	wait                 helm started watching the chart's objects (--wait)
//	post-hook            helm created a post-* hook object
//	after-final-write    helm wrote its final status (or deleted a record)
//	before-release       helm is done, the lock is not given back yet
package chaos
