package servertime

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// DateResolution is the resolution of the HTTP Date header: the server
// truncates its clock to whole seconds when it writes the header.
const DateResolution = time.Second

// driftDivisor sets the drift allowance: elapsed local time is trusted to
// 1/driftDivisor (200 ppm), far looser than any working quartz clock.
const driftDivisor = 5000

// ErrUnknown reports that no response has been observed yet, so nothing is
// known about the server's clock.
var ErrUnknown = errors.New("api server time unknown: no response with a Date header observed yet")

// Bounds brackets the API server's clock at one local instant: the true
// server time t satisfies Earliest <= t <= Latest.
type Bounds struct {
	Earliest time.Time
	Latest   time.Time
}

// Width is the uncertainty of the estimate.
func (b Bounds) Width() time.Duration { return b.Latest.Sub(b.Earliest) }

// IsZero reports whether b carries no estimate.
func (b Bounds) IsZero() bool { return b.Earliest.IsZero() && b.Latest.IsZero() }

// observation is one response: local send and receive readings (monotonic
// when they come from a real clock) and the server's Date header.
type observation struct {
	sent, recv, date time.Time
}

// earliestAt is the lower bound observation o gives at local instant t. It
// counts only the local time certainly elapsed since o was received (the
// smaller estimate of sleepclock.Elapsed): time this machine may have spent
// asleep, or a wall clock stepped forward, must not make another holder's
// lock look expired sooner.
func (e *Estimator) earliestAt(o *observation, t time.Time) time.Time {
	el, _ := sleepclock.Elapsed(e.clock, o.recv, t)
	return o.date.Add(el - el/driftDivisor)
}

// latestAt is the upper bound observation o gives at local instant t. It
// counts all the local time that may have elapsed since o was sent (the
// larger estimate of sleepclock.Elapsed), time spent asleep included, since
// the server's clock ran on meanwhile.
func (e *Estimator) latestAt(o *observation, t time.Time) time.Time {
	_, el := sleepclock.Elapsed(e.clock, o.sent, t)
	return o.date.Add(DateResolution + el + el/driftDivisor)
}

// Estimator estimates the API server's clock from observed responses. It is
// safe for concurrent use. The zero value is not usable; call New.
type Estimator struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// lo and hi are the observations giving the largest lower bound and the
	// smallest upper bound. All lower bounds grow at the same rate (as do all
	// upper bounds), so the best one stays the best until a better one
	// arrives and two observations are all that must be kept. (Where the
	// wall clock is cross-checked, a step of it can change the rates; every
	// observation's bounds stay true, the kept ones merely less tight.)
	lo, hi *observation
	// rtt is the round trip of the latest observation.
	rtt    time.Duration
	resets int
}

// New returns an Estimator that reads local time from clk (sleepclock.System()
// in production). Only differences between readings of clk are used, as
// sleepclock.Elapsed measures them: when clk is a sleepclock.Meter, the
// lower bound counts only the time certainly elapsed and the upper bound
// also any time the machine spent asleep.
func New(clk clock.PassiveClock) *Estimator {
	return &Estimator{clock: clk}
}

// Clock returns the local clock the estimator measures elapsed time with.
func (e *Estimator) Clock() clock.PassiveClock { return e.clock }

// Observe records one response: sentLocal and recvLocal are readings of the
// estimator's clock taken just before the request was sent and just after
// the response headers arrived; date is the response's Date header.
// Inconsistent readings (received before sent, or in the future) are ignored.
func (e *Estimator) Observe(sentLocal, recvLocal, date time.Time) {
	if date.IsZero() || recvLocal.Before(sentLocal) {
		return
	}
	o := &observation{sent: sentLocal, recv: recvLocal, date: date.Round(0).UTC()}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	if now.Before(recvLocal) {
		return
	}
	e.rtt = recvLocal.Sub(sentLocal)
	if e.lo == nil {
		e.lo, e.hi = o, o
		return
	}
	lo, hi := e.lo, e.hi
	if e.earliestAt(o, now).After(e.earliestAt(lo, now)) {
		lo = o
	}
	if e.latestAt(o, now).Before(e.latestAt(hi, now)) {
		hi = o
	}
	if e.earliestAt(lo, now).After(e.latestAt(hi, now)) {
		// The observations contradict each other: the server clock was
		// stepped, or several API servers disagree. The server is the
		// reference, so start again from what it says now.
		e.lo, e.hi = o, o
		e.resets++
		return
	}
	e.lo, e.hi = lo, hi
}

// Now returns bounds on the server's clock at this local instant, and false
// when nothing has been observed yet.
func (e *Estimator) Now() (Bounds, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lo == nil {
		return Bounds{}, false
	}
	now := e.clock.Now()
	return Bounds{Earliest: e.earliestAt(e.lo, now), Latest: e.latestAt(e.hi, now)}, true
}

// ProbeAt returns the local instant, no earlier than notBefore and less than
// a second after it, at which a request should be sent so that its Date
// header halves the current uncertainty: the instant at which the middle of
// the bounds crosses a whole second of server time. Whichever second the
// server then reports, one bound moves to that crossing. A few such requests
// narrow the bounds from a second to about one round trip. It returns false
// when there is no estimate yet or the bounds are already no wider than
// want.
func (e *Estimator) ProbeAt(notBefore time.Time, want time.Duration) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lo == nil {
		return time.Time{}, false
	}
	lo, hi := e.earliestAt(e.lo, notBefore), e.latestAt(e.hi, notBefore)
	w := hi.Sub(lo)
	if w <= want {
		return time.Time{}, false
	}
	// The server writes the Date about half a round trip after the send.
	mid := lo.Add(w/2 + e.rtt/2)
	wait := (DateResolution - mid.Sub(mid.Truncate(DateResolution))) % DateResolution
	return notBefore.Add(wait), true
}

// Probe makes one cheap request (GET /version) whatever is known already,
// to add an observation; see ProbeAt for when to send it.
func (e *Estimator) Probe(ctx context.Context, disco interface{ RESTClient() rest.Interface }) error {
	var rc rest.Interface
	if disco != nil {
		rc = disco.RESTClient()
	}
	if rc == nil {
		return fmt.Errorf("probe api server time: no REST client: %w", ErrUnknown)
	}
	if err := rc.Get().AbsPath("/version").Do(ctx).Error(); err != nil {
		return fmt.Errorf("probe api server time: GET /version: %w", err)
	}
	return nil
}

// WrapTransport returns a RoundTripper that records the Date header of every
// response passing through rt. It has the signature of
// rest.Config.WrapTransport.
func (e *Estimator) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return &dateRecorder{next: rt, est: e}
}

// Instrument returns a copy of cfg whose clients feed this estimator.
func (e *Estimator) Instrument(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(e.WrapTransport)
	return c
}

// Sync makes one cheap request (GET /version) when nothing has been observed
// yet, so that Now has an answer. Pass client.Discovery() of a clientset
// built from a configuration wrapped by WrapTransport or Instrument.
func (e *Estimator) Sync(ctx context.Context, disco interface{ RESTClient() rest.Interface }) error {
	if _, ok := e.Now(); ok {
		return nil
	}
	var rc rest.Interface
	if disco != nil {
		rc = disco.RESTClient()
	}
	if rc == nil {
		return fmt.Errorf("sync api server time: no REST client: %w", ErrUnknown)
	}
	// Any response carries a Date header, an error status included, so the
	// request's own error only matters when nothing was observed.
	reqErr := rc.Get().AbsPath("/version").Do(ctx).Error()
	if _, ok := e.Now(); ok {
		return nil
	}
	if reqErr != nil {
		return fmt.Errorf("sync api server time: GET /version: %w", errors.Join(ErrUnknown, reqErr))
	}
	return fmt.Errorf("sync api server time: GET /version answered without a Date header reaching the estimator (is the client built with WrapTransport?): %w", ErrUnknown)
}

type dateRecorder struct {
	next http.RoundTripper
	est  *Estimator
}

func (d *dateRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := d.est.clock.Now()
	resp, err := d.next.RoundTrip(req)
	if err != nil || resp == nil {
		return resp, err
	}
	recv := d.est.clock.Now()
	if v := resp.Header.Get("Date"); v != "" {
		if date, perr := http.ParseTime(v); perr == nil {
			d.est.Observe(sent, recv, date)
		}
	}
	return resp, nil
}

// WrappedRoundTripper lets client-go's transport helpers see through the
// wrapper.
func (d *dateRecorder) WrappedRoundTripper() http.RoundTripper { return d.next }

// settleAt returns, for bounds b that straddle t at local instant now, the
// local instant at which to look again and whether to send a probe then: the
// moment the lower bound alone reaches t, or sooner a probe timed by
// ProbeAt, no earlier than notBefore.
func (e *Estimator) settleAt(b Bounds, now, notBefore, t time.Time, probing bool) (time.Time, bool) {
	gap := t.Sub(b.Earliest)
	// The lower bound grows by (1 - 1/driftDivisor) per local second.
	reach := now.Add(gap + gap/(driftDivisor-1) + time.Millisecond)
	if probing {
		if p, ok := e.ProbeAt(later(now, notBefore), 0); ok && p.Before(reach) {
			return p, true
		}
	}
	return reach, false
}

// Settle answers "has the server's clock certainly passed t?" for a caller
// that should not answer no merely because its estimate is still wide. When
// the upper bound has not passed t it returns false at once, and when the
// lower bound has, true. While the bounds straddle t it waits: at most until
// the lower bound alone passes t (no longer than the bounds are wide, about
// a second for a fresh process), sending requests with probe at the instants
// ProbeAt picks so that it is settled sooner. clk must be the estimator's
// clock. It returns ErrUnknown when nothing has been observed, and ctx's
// error when ctx ends first. A failing probe is not retried; the wait goes
// on without probes.
func (e *Estimator) Settle(ctx context.Context, clk clock.Clock, t time.Time, probe func(context.Context) error) (bool, error) {
	var notBefore time.Time
	probing := probe != nil
	for {
		b, ok := e.Now()
		if !ok {
			return false, ErrUnknown
		}
		if b.Earliest.After(t) {
			return true, nil
		}
		if !b.Latest.After(t) {
			return false, nil
		}
		now := clk.Now()
		at, doProbe := e.settleAt(b, now, notBefore, t, probing)
		timer := clk.NewTimer(at.Sub(now))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false, fmt.Errorf("settle api server time: %w", ctx.Err())
		case <-timer.C():
		}
		if doProbe {
			if err := probe(ctx); err != nil {
				probing = false
			}
			notBefore = clk.Now().Add(probeGap)
		}
	}
}

// probeGap is the least time between two probes sent by Settle.
const probeGap = 10 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ProbeFunc returns a probe for Settle that sends Probe through disco.
func (e *Estimator) ProbeFunc(disco interface{ RESTClient() rest.Interface }) func(context.Context) error {
	return func(ctx context.Context) error { return e.Probe(ctx, disco) }
}
