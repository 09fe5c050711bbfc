//go:build chaos

package chaos

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
}

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
	recordName = regexp.MustCompile(`/api/v1/namespaces/[^/]+/(?:secrets|configmaps)(?:/sh\.helm\.release\.v1\.[^/]+)?$`)
	statusLbl  = regexp.MustCompile(`"status":"([a-z-]+)"`)
	hookAnn    = regexp.MustCompile(`"helm\.sh/hook":"(pre|post)-`)
	applied    sync.Once
	watched    sync.Once
)

// Classify returns the point helm's request req reaches once it is
// answered ("" for none). It reads (and puts back) a write's body.
func Classify(req *http.Request) string {
	path := req.URL.Path
	if req.Method == http.MethodGet {
		if req.URL.Query().Get("watch") == "true" && !strings.Contains(path, "/secrets") && !strings.Contains(path, "/leases") && !strings.Contains(path, "/events") {
			return "wait"
		}
		return ""
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	isRecord := recordName.MatchString(path) && (bytes.Contains(body, []byte(`"owner":"helm"`)) || strings.Contains(path, "sh.helm.release.v1."))
	switch {
	case isRecord && req.Method == http.MethodDelete:
		return "after-final-write"
	case isRecord:
		m := statusLbl.FindSubmatch(body)
		if m == nil {
			return ""
		}
		switch string(m[1]) {
		case "pending-install", "pending-upgrade", "pending-rollback", "uninstalling":
			return "after-pending-write"
		case "deployed", "uninstalled":
			return "after-final-write"
		}
		return ""
	case strings.Contains(path, "/leases") || strings.Contains(path, "/events"):
		return ""
	}
	if m := hookAnn.FindSubmatch(body); m != nil {
		return string(m[1]) + "-hook"
	}
	return "apply"
}

// Answered acts on point (from Classify) once its request was answered
// with success.
func Answered(point string, resp *http.Response, err error) {
	if point == "" || err != nil || resp == nil || resp.StatusCode >= 300 {
		return
	}
	switch point {
	case "apply":
		applied.Do(func() { Point(point) })
	case "wait":
		watched.Do(func() { Point(point) })
	default:
		Point(point)
	}
}
