//go:build chaos

package chaos

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"helm.sh/helm/v4/pkg/action"
)

// Enabled reports whether this is a chaos build.
const Enabled = true

// Environment variables read by chaos builds (see the package documentation).
const (
	EnvKillAt      = "HELM_AUTORECOVER_CHAOS_KILL_AT"
	EnvStopAt      = "HELM_AUTORECOVER_CHAOS_STOP_AT"
	EnvLog         = "HELM_AUTORECOVER_CHAOS_LOG"
	EnvClockOffset = "HELM_AUTORECOVER_CHAOS_CLOCK_OFFSET"
	EnvSuspendAt   = "HELM_AUTORECOVER_CHAOS_SUSPEND_AT"
	EnvFreezeAt    = "HELM_AUTORECOVER_CHAOS_FREEZE_AT"
)

var (
	mu     sync.Mutex
	hits   = map[string]int{}
	offset time.Duration
)

func init() {
	if v := os.Getenv(EnvClockOffset); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %s=%q: %v\n", EnvClockOffset, v, err)
			os.Exit(2)
		}
		offset = d
		action.Timestamper = func() time.Time { return time.Now().Add(offset) }
	}
}

// ClockOffset is the simulated skew of this process's wall clock.
func ClockOffset() time.Duration { return offset }

// Point notes that the process reached the named point and kills or stops
// it there when the environment says so.
func Point(name string) {
	mu.Lock()
	hits[name]++
	n := hits[name]
	mu.Unlock()
	if f := os.Getenv(EnvLog); f != "" {
		if w, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(w, "%s %d\n", name, os.Getpid())
			_ = w.Sync()
			_ = w.Close()
		}
	}
	if matches(os.Getenv(EnvKillAt), name, n) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	if matches(os.Getenv(EnvStopAt), name, n) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	if spec, d, ok := strings.Cut(os.Getenv(EnvSuspendAt), ":"); ok && matches(spec, name, n) {
		slept, err := time.ParseDuration(d)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %s=%q: %v\n", EnvSuspendAt, os.Getenv(EnvSuspendAt), err)
			os.Exit(2)
		}
		// The machine "sleeps": the process stops (the runner holds it
		// as long as the world should move on), and once continued the
		// boot-time clock claims slept more than the monotonic one.
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		suspended.Add(int64(slept))
	}
	if matches(os.Getenv(EnvFreezeAt), name, n) {
		freeze()
	}
}

// The clocks of EnvFreezeAt: the readings of Now are time.Now() less
// frozen; while freezing, they all read the instant the clocks stopped,
// stoppedAt. Readings are taken under clockMu, so that none made by another
// goroutine, once the process is continued and before freeze has counted
// the stop, reads the time that passed meanwhile.
var (
	clockMu   sync.Mutex
	frozen    time.Duration
	freezing  bool
	stoppedAt time.Time
)

// freeze simulates a virtual machine stopped and resumed: the process
// stops (the runner holds it as long as the world should move on), and
// once continued its clocks read as if no time had passed meanwhile,
// monotonic and boot time alike.
func freeze() {
	clockMu.Lock()
	freezing, stoppedAt = true, time.Now()
	clockMu.Unlock()
	stopThisThread()
	clockMu.Lock()
	frozen += time.Since(stoppedAt)
	freezing = false
	clockMu.Unlock()
}

// Now is time.Now() as this process's clocks read it: less the time they
// stood still in the simulated stops of EnvFreezeAt. sleepclock.System
// reads it.
func Now() time.Time {
	clockMu.Lock()
	defer clockMu.Unlock()
	if freezing {
		return stoppedAt.Add(-frozen)
	}
	return time.Now().Add(-frozen)
}

// suspended is the time the simulated system sleeps of EnvSuspendAt add to
// the machine's (CLOCK_BOOTTIME less CLOCK_MONOTONIC).
var suspended atomic.Int64

// Suspended is the total simulated system sleep so far: sleepclock's
// sampler of the suspended time adds it to the kernel's.
func Suspended() time.Duration { return time.Duration(suspended.Load()) }

// matches reports whether spec (POINT or POINT#N) names the nth reach of
// point name.
func matches(spec, name string, n int) bool {
	if spec == "" {
		return false
	}
	want := 1
	if p, c, ok := strings.Cut(spec, "#"); ok {
		spec = p
		var err error
		if want, err = strconv.Atoi(c); err != nil {
			return false
		}
	}
	return spec == name && n == want
}

var (
	applied  sync.Once
	didApply atomic.Bool
	watched  sync.Once
)

// Classify returns the point helm's request req reaches once it is
// answered ("" for none). It reads (and puts back) a write's body.
func Classify(req *http.Request) string {
	var body []byte
	if req.Method != http.MethodGet && req.Body != nil && req.Body != http.NoBody {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return classify(req.Method, req.URL.Path, req.URL.Query().Get("watch") == "true", body)
}

// Answered acts on point (from Classify) once its request was answered
// with success.
func Answered(point string, resp *http.Response, err error) {
	if point == "" || err != nil || resp == nil || resp.StatusCode >= 300 {
		return
	}
	switch point {
	case "apply":
		applied.Do(func() { didApply.Store(true); Point(point) })
	case "wait":
		// helm's wait for the chart's objects, not for a hook's.
		if didApply.Load() {
			watched.Do(func() { Point(point) })
		}
	default:
		Point(point)
	}
}
