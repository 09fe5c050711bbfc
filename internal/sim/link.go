package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Faults are the network's faults for a schedule: each request draws
// its latency and at most one fault.
type Faults struct {
	// MaxLatency bounds each request's latency (half before the server
	// handles it, half after).
	MaxLatency time.Duration
	// Reset is the share of requests whose connection is reset before the
	// server sees them.
	Reset float64
	// Lost is the share of writes that commit but whose answer is lost
	// (a reset after the server answered).
	Lost float64
	// Throttle is the share answered 429 with Retry-After: 1; Unavailable
	// the share answered 500 or 503; Conflict the share of writes answered
	// 409 without being applied.
	Throttle, Unavailable, Conflict float64
}

// Counts are what a link did, by kind.
type Counts struct {
	Requests, Reset, Lost, Throttle, Unavailable, Conflict int
}

// Link is one simulated client's connection to the Model: an
// http.RoundTripper that tags requests with the client, draws latency and
// faults from the schedule's seeded source, shifts the Date header of the
// answers by DateShift, holds requests while the client is paused or
// asleep, and crashes the client at its CrashAt-th request: that request
// commits or not (Draw decides), and nothing is sent after it.
type Link struct {
	Model     *Model
	Client    string
	Faults    Faults
	DateShift time.Duration
	Clock     *Clock
	// CrashAt, PauseAt and SleepAt count requests from 1; 0 is never.
	CrashAt, PauseAt, SleepAt int
	// CrashCommits makes the request the crash happens at commit first.
	CrashCommits       bool
	PauseFor, SleepFor time.Duration
	// OnCrash is called once, when the client crashes.
	OnCrash func()

	mu      sync.Mutex
	rnd     *rand.Rand
	n       int
	dead    bool
	crashed time.Time
	held    time.Time // requests and answers wait until then
	Counts  Counts
}

// ErrCrashed is the error every request of a crashed client gets.
var ErrCrashed = errors.New("sim: the client crashed")

// NewLink returns a link drawing from seed.
func NewLink(m *Model, client string, seed int64) *Link {
	return &Link{Model: m, Client: client, rnd: rand.New(rand.NewSource(seed))}
}

// Crashed reports whether and when the client crashed.
func (l *Link) Crashed() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.crashed, l.dead
}

type draw struct {
	n       int
	latency time.Duration
	fault   string
	crash   bool
}

func (l *Link) next(write bool) (draw, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return draw{}, ErrCrashed
	}
	l.n++
	l.Counts.Requests++
	d := draw{n: l.n}
	if l.Faults.MaxLatency > 0 {
		d.latency = time.Duration(l.rnd.Int63n(int64(l.Faults.MaxLatency)))
	}
	f := l.Faults
	x := l.rnd.Float64()
	switch {
	case x < f.Reset:
		d.fault = "reset"
	case x < f.Reset+f.Throttle:
		d.fault = "throttle"
	case x < f.Reset+f.Throttle+f.Unavailable:
		d.fault = "unavailable"
	case write && x < f.Reset+f.Throttle+f.Unavailable+f.Conflict:
		d.fault = "conflict"
	case write && x < f.Reset+f.Throttle+f.Unavailable+f.Conflict+f.Lost:
		d.fault = "lost"
	}
	now := time.Now()
	switch l.n {
	case l.CrashAt:
		d.crash = true
	case l.PauseAt:
		l.held = now.Add(l.PauseFor)
	case l.SleepAt:
		l.held = now.Add(l.SleepFor)
		if l.Clock != nil {
			l.Clock.Suspend(l.SleepFor)
		}
	}
	return d, nil
}

// crash ends the client for good.
func (l *Link) crash() {
	l.mu.Lock()
	first := !l.dead
	l.dead = true
	if first {
		l.crashed = time.Now()
	}
	on := l.OnCrash
	l.mu.Unlock()
	if first && on != nil {
		on()
	}
}

func (l *Link) alive() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return ErrCrashed
	}
	return nil
}

// waitHeld waits while the client is paused or asleep.
func (l *Link) waitHeld(ctx context.Context) error {
	for {
		l.mu.Lock()
		until := l.held
		l.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return nil
		}
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func resetError() error {
	return &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET, Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6443}}
}

// RoundTrip implements http.RoundTripper.
func (l *Link) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	sent := time.Now()
	write := req.Method != http.MethodGet
	d, err := l.next(write)
	if err != nil {
		drain(req)
		return nil, err
	}
	req = req.Clone(ctx)
	req.Header.Set(ClientHeader, l.Client)
	req.Header.Set(SentHeader, sent.Format(time.RFC3339Nano))
	if d.crash {
		if l.CrashCommits {
			closeResp(l.Model.Serve(req))
		} else {
			drain(req)
		}
		l.crash()
		return nil, ErrCrashed
	}
	if err := l.waitHeld(ctx); err != nil {
		drain(req)
		return nil, err
	}
	if err := sleepCtx(ctx, d.latency/2); err != nil {
		drain(req)
		return nil, err
	}
	if err := l.alive(); err != nil {
		drain(req)
		return nil, err
	}
	l.count(d.fault)
	switch d.fault {
	case "reset":
		drain(req)
		return nil, resetError()
	case "throttle":
		drain(req)
		r := statusResponse(http.StatusTooManyRequests, "TooManyRequests", "sim: too many requests")
		r.Header.Set("Retry-After", "1")
		return l.answer(req, r), nil
	case "unavailable":
		drain(req)
		code := http.StatusInternalServerError
		if d.n%2 == 0 {
			code = http.StatusServiceUnavailable
		}
		return l.answer(req, statusResponse(code, "InternalError", "sim: the server failed")), nil
	case "conflict":
		drain(req)
		return l.answer(req, conflict("sim", "injected")), nil
	}
	resp := l.Model.Serve(req)
	if err := sleepCtx(ctx, d.latency-d.latency/2); err != nil {
		closeResp(resp)
		return nil, err
	}
	if err := l.waitHeld(ctx); err != nil {
		closeResp(resp)
		return nil, err
	}
	if err := l.alive(); err != nil {
		closeResp(resp)
		return nil, err
	}
	if d.fault == "lost" {
		closeResp(resp)
		return nil, resetError()
	}
	return l.answer(req, resp), nil
}

func (l *Link) count(fault string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch fault {
	case "reset":
		l.Counts.Reset++
	case "lost":
		l.Counts.Lost++
	case "throttle":
		l.Counts.Throttle++
	case "unavailable":
		l.Counts.Unavailable++
	case "conflict":
		l.Counts.Conflict++
	}
}

// answer finishes an answer: its request, and the Date header shifted on
// this client's path.
func (l *Link) answer(req *http.Request, resp *http.Response) *http.Response {
	resp.Request = req
	date := time.Now()
	if v := resp.Header.Get("Date"); v != "" {
		if t, err := http.ParseTime(v); err == nil {
			date = t
		}
	}
	resp.Header.Set("Date", date.Add(l.DateShift).UTC().Format(http.TimeFormat))
	if resp.Header.Get("Content-Type") == "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	return resp
}

func drain(req *http.Request) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
}

func closeResp(r *http.Response) {
	if r != nil && r.Body != nil {
		_ = r.Body.Close()
	}
}

// String describes the link's faults for a trace.
func (c Counts) String() string {
	return fmt.Sprintf("requests=%d reset=%d lost=%d 429=%d 5xx=%d 409=%d", c.Requests, c.Reset, c.Lost, c.Throttle, c.Unavailable, c.Conflict)
}
