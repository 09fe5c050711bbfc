package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// These tests run clients that confirm recent expiries on their own clock,
// as in production (Confirm), some of them reading a server whose Date
// header runs ahead (a replica with a wrong clock, a proxy's error page).

type tryResult struct {
	held *part
	err  error
}

func tryAsync(ctx context.Context, c *client, r Request) <-chan tryResult {
	done := make(chan tryResult, 1)
	go func() {
		h, _, err := c.b.TryAcquire(ctx, r)
		done <- tryResult{h, err}
	}()
	return done
}

func waitAsync(ctx context.Context, c *client, r Request) <-chan tryResult {
	done := make(chan tryResult, 1)
	go func() {
		h, err := c.b.Wait(ctx, r, nil)
		done <- tryResult{h, err}
	}()
	return done
}

// takenOverAfter moves the world's clocks on 100 ms at a time while waiter
// c waits, until done has its take of the lock of dead; it fails the test
// when the take came before least, or not within least + 2 s (stuck says
// what that means).
func takenOverAfter(t *testing.T, w *world, c *client, done <-chan tryResult, dead string, least time.Duration, stuck string) {
	t.Helper()
	for elapsed := time.Duration(0); ; elapsed += 100 * time.Millisecond {
		select {
		case res := <-done:
			if res.err != nil {
				t.Fatal(res.err)
			}
			if elapsed < least {
				t.Fatalf("taken over %v after the holder's last renewal, before a lease and the margin (%v)", elapsed, least)
			}
			if res.held.PreviousState != Expired || res.held.Previous.Session != dead {
				t.Errorf("previous = %v %+v", res.held.PreviousState, res.held.Previous)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if elapsed > least+2*time.Second {
			t.Fatal(stuck)
		}
		waitTimers(t, c, 2)
		w.advance(100 * time.Millisecond)
	}
}

// settle waits until c waits on its clock or done has a result.
func settle(t *testing.T, c *client, done <-chan tryResult) (tryResult, bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case r := <-done:
			return r, true
		default:
		}
		if c.clk.HasWaiters() {
			return tryResult{}, false
		}
		if time.Now().After(deadline) {
			t.Fatal("the client neither waited nor returned")
		}
		time.Sleep(time.Millisecond)
	}
}

// stepUntilDone moves the clocks on (step) 100 ms at a time, each time
// once the waiting client's timers are set (ready), until done has a
// result, and returns it with the time moved; it fails the test with
// stuck once limit has passed.
func stepUntilDone[T any](t *testing.T, done <-chan T, limit time.Duration, ready func(), step func(time.Duration), stuck string) (T, time.Duration) {
	t.Helper()
	elapsed := time.Duration(0)
	for {
		select {
		case res := <-done:
			return res, elapsed
		case <-time.After(20 * time.Millisecond):
		}
		if elapsed > limit {
			t.Fatal(stuck)
		}
		ready()
		step(100 * time.Millisecond)
		elapsed += 100 * time.Millisecond
	}
}

// refusedAsRenewing renews held every second (a third of its 3 s lease)
// while client b, started with done, waits to confirm its lock, and checks
// that b is refused at a renewal it sees, as by any live holder.
func refusedAsRenewing(ctx context.Context, t *testing.T, w *world, b *client, held *part, done <-chan tryResult) {
	t.Helper()
	var res tryResult
	for i := 0; ; i++ {
		r, ok := settle(t, b, done)
		if ok {
			res = r
			break
		}
		if i > 3 {
			t.Fatal("still waiting after a renewal was made to be seen")
		}
		w.advance(time.Second)
		if err := held.Renew(ctx); err != nil {
			t.Fatalf("the live holder lost its lock at its renewal %d: %v", i+1, err)
		}
	}
	var le *LockedError
	if !errors.As(res.err, &le) || le.State != Live || le.HolderIdentity != held.Session() || !le.Renewing {
		t.Fatalf("the taker's result = %+v, %v; want locked by the live holder, seen renewing", res.held, res.err)
	}
}

// TestDateAheadTakerConfirmsADeadHolder: the holder dies; a client whose
// Date runs 10 s ahead judges its lock expired at once, but takes it over
// only once it has seen it unchanged for a lease (3 s) and the margin (1 s)
// on its own clock, and says it waits.
func TestDateAheadTakerConfirmsADeadHolder(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 0), w.dated(0, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := req(OpUpgrade, 3*time.Second)
	var told []time.Duration
	r.onConfirm = func(_ *Record, in time.Duration) { told = append(told, in) }
	done := tryAsync(ctx, b, r)
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("took over a lock expired only by a shifted Date, at once: %+v", res)
	}
	w.advance(4*time.Second - time.Millisecond)
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("took over before a lease and the margin on its own clock: %+v", res)
	}
	w.advance(time.Millisecond)
	var res tryResult
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover a lease and the margin after the lock was first seen")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.held.PreviousState != Expired || res.held.Previous == nil || res.held.Previous.Session != dead.Session() {
		t.Errorf("previous = %v %+v", res.held.PreviousState, res.held.Previous)
	}
	if len(told) != 1 || told[0] != 4*time.Second {
		t.Errorf("told of the wait %v, want once, 4s", told)
	}
}

// TestDateAheadTakerNeverTakesARenewingHolder: the holder renews every
// second (a third of its lease); a client whose Date runs 10 s ahead judges
// every renewal expired by server time alone, yet never takes the lock: the
// first renewal it reads while it waits for the confirmation shows the
// holder alive, and it is refused as by any live holder.
func TestDateAheadTakerNeverTakesARenewingHolder(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 0), w.dated(0, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	refusedAsRenewing(ctx, t, w, b, held, done)
	if err := held.Renew(ctx); err != nil {
		t.Errorf("the holder lost its lock: %v", err)
	}
}

// TestNoWaitTakerConfirmsAHolderStampedAhead: the holder's Date ran 30 s
// ahead, so its LOCKED TILL stands 30 s ahead of the server's clock as the
// taker reads it, more than its lease can explain. A client that does not
// wait judges it by its own clock: it waits for the confirmation (a lease,
// the margin and the stamp's second of uncertainty) and takes it over,
// instead of being refused until the server's clock catches up with the
// dead holder's stamp (the simulation, seed 95473).
func TestNoWaitTakerConfirmsAHolderStampedAhead(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 30*time.Second), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := req(OpUpgrade, 3*time.Second)
	var told []time.Duration
	r.onConfirm = func(_ *Record, in time.Duration) { told = append(told, in) }
	done := tryAsync(ctx, b, r)
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("the client did not wait for the confirmation: %+v, %v", res.held, res.err)
	}
	res, elapsed := stepUntilDone(t, done, 7*time.Second, func() { waitTimers(t, b, 1) }, w.advance, "the dead holder's lock stamped ahead was not taken over")
	if res.err != nil {
		t.Fatalf("the dead holder's lock stamped ahead was not taken over: %v", res.err)
	}
	if elapsed < 4*time.Second || res.held.PreviousState != Expired || res.held.Previous.Session != dead.Session() {
		t.Errorf("taken over after %v (want a lease and the margin at least, 4 s), from %v %+v", elapsed, res.held.PreviousState, res.held.Previous)
	}
	if len(told) != 1 || told[0] < 4*time.Second || told[0] > 5*time.Second {
		t.Errorf("told of the wait %v, want once, a lease, the margin and the stamp's uncertainty (4 to 5 s)", told)
	}
}

// TestNoWaitTakerRefusesARenewingHolderStampedAhead: the same holder,
// alive, renews every second: the client that waits for the confirmation
// sees a renewal and is refused, as by any live holder.
func TestNoWaitTakerRefusesARenewingHolderStampedAhead(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 30*time.Second), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	refusedAsRenewing(ctx, t, w, b, held, done)
}

// TestNoWaitTakerSeesARenewalNarrowerThanTheTake: the holder stamped ahead
// took its lock with an estimate 2 s wide (a slow first answer), and
// renews it 2 s later with one a few milliseconds wide. The client that
// waits for the confirmation first saw the take a second after it was
// made and reads the renewal a second later: seen a second later, but
// counted 2 s less of uncertainty, the renewal would be confirmed earlier
// than the take. It is still a renewal: the client is refused at once, as
// by any live holder, not kept waiting for a confirmation that a holder
// renewing every third of its lease puts off each time (without the fix
// it waited, and took the lock once this holder, which renews no more
// here, had stopped).
func TestNoWaitTakerSeesARenewalNarrowerThanTheTake(t *testing.T) {
	w := newWorld(t)
	a := w.datedRTT(0, 30*time.Second, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if u := uncertainty(ptr(held.Record()), held.Session()); u < 1900*time.Millisecond {
		t.Fatalf("the take's stamp is %v uncertain; the test needs about 2 s", u)
	}
	w.advance(time.Second)
	b := w.dated(0, 0)
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("the client did not wait for the confirmation: %+v, %v", res.held, res.err)
	}
	// Just before the next second of the holder's shifted clock, a Date
	// of the second before narrows its estimate to a few milliseconds.
	w.advance(999 * time.Millisecond)
	a.est.Observe(a.clk.Now(), a.clk.Now(), t0.Add(31*time.Second+999*time.Millisecond).Truncate(time.Second))
	if err := held.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if u := uncertainty(ptr(held.Record()), held.Session()); u > 100*time.Millisecond {
		t.Fatalf("the renewal's stamp is %v uncertain, want a few milliseconds", u)
	}
	var res tryResult
	for i := 0; ; i++ {
		w.advance(time.Millisecond)
		r, ok := settle(t, b, done)
		if ok {
			res = r
			break
		}
		if i > 40 {
			t.Fatal("the client still waits, 4 s after the holder renewed: the renewal was not seen")
		}
		w.advance(100 * time.Millisecond)
	}
	var le *LockedError
	if !errors.As(res.err, &le) || le.State != Live || !le.Renewing {
		t.Fatalf("the taker's result = %+v, %v; want locked by the live holder, seen renewing", res.held, res.err)
	}
}

// TestLongOverdueLockWaitsALeaseToo: however long ago a lock expired by the
// server's clock, a client that did not see it expire takes it over only
// once it has seen it unchanged for a lease and the margin: a Date header
// that runs far ahead (a proxy's error page) would otherwise take a live
// holder's lock at once.
func TestLongOverdueLockWaitsALeaseToo(t *testing.T) {
	w := newWorld(t)
	a := w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second)); err != nil {
		t.Fatal(err)
	}
	w.advance(time.Hour)
	b := w.dated(0, 0)
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	for waited := time.Duration(0); ; waited += time.Second {
		res, ok := settle(t, b, done)
		if ok {
			if res.err != nil || res.held.PreviousState != Expired {
				t.Fatalf("held %+v, err %v", res.held, res.err)
			}
			if waited < 4*time.Second {
				t.Fatalf("took over after %v on its own clock, before a lease and the margin", waited)
			}
			return
		}
		if waited > 10*time.Second {
			t.Fatal("no takeover of a lock an hour overdue")
		}
		w.advance(time.Second)
	}
}

// TestDateBehindWaiterTakesADeadHolderAfterALease: a waiter whose Date
// runs 10 minutes behind judges a dead holder's lock live for 10 minutes by
// the server's clock; it takes it over once it has seen it unchanged for a
// lease and the margin on its own.
func TestDateBehindWaiterTakesADeadHolderAfterALease(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 0), w.dated(0, -10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := waitAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	takenOverAfter(t, w, b, done, dead.Session(), 4*time.Second, "the waiter still waits for the server's clock to catch up 10 minutes")
}

// TestWaiterSeesRenewalsOnItsWatch: a waiter that watched the holder
// renew (on its watch, sightEvent, or on its own heartbeat's reads) has
// seen the last renewal when it was made: once the holder dies, it takes
// over at the lock's expiry in server time, not a lease later. Confirm
// costs a client that waits nothing.
func TestWaiterSeesRenewalsOnItsWatch(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 0), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := waitAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	key := b.b.sightKey(ns, LeaseName("web"))
	sawRenewal := func() bool {
		b.b.Sightings.mu.Lock()
		defer b.b.Sightings.mu.Unlock()
		return b.b.Sightings.m[key].renewed.Equal(held.Record().RenewedAt)
	}
	for range 3 {
		waitTimers(t, b, 2)
		w.advance(time.Second)
		if err := held.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the waiter seeing the renewal", sawRenewal)
	}
	// The holder dies. Its LOCKED TILL is its last renewal's upper bound of
	// server time (1 s wide) plus 3 s; the waiter's lower bound passes it
	// and the margin 5 s after that renewal; having seen that renewal when
	// it was made, it takes the lock over a lease and the margin (4 s)
	// after it, on its own clock.
	takenOverAfter(t, w, b, done, held.Session(), 4*time.Second, "the waiter did not take over at the lock's expiry: its confirmation started late")
}

// TestNoWaitTakerConfirmsOnARealClock: a client without --lock-timeout
// finds a dead holder's lock expired by the server's clock (its holder's
// Date ran 10 s behind; lease 3 s) and waits for the confirmation on a real clock,
// reading the lock again meanwhile: an unchanged lock, read at moments a
// few nanoseconds apart, is not a renewal (review of 2a688a9, F1), and the
// lock is taken over.
func TestNoWaitTakerConfirmsOnARealClock(t *testing.T) {
	cs, _ := newCASClient()
	backend := func(dateShift time.Duration) *Backend {
		est := servertime.New(clock.RealClock{})
		now := time.Now()
		est.Observe(now, now, now.Add(dateShift).Truncate(time.Second))
		return NewLeaseBackend(cs, est, clock.RealClock{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dead, _, err := backend(-10*time.Second).TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := req(OpUpgrade, 3*time.Second)
	confirming := false
	r.onConfirm = func(*Record, time.Duration) { confirming = true }
	h, _, err := backend(0).TryAcquire(ctx, r)
	if err != nil {
		t.Fatalf("the dead holder's lock was not taken over: %v", err)
	}
	if !confirming || h.PreviousState != Expired || h.Previous == nil || h.Previous.Session != dead.Session() {
		t.Errorf("confirmed %v, previous %v %+v", confirming, h.PreviousState, h.Previous)
	}
}

// TestConfirmingTakerKeepsItsTurn: a client that does not wait finds a
// dead holder's lock expired and waits a lease to confirm it on its own
// clock; meanwhile a waiter arrives and queues. The first client came
// first: it takes the lock once confirmed, and the waiter waits behind it
// (the simulation, seeds 1280, 1790, 2254, 2534, 4828: it was refused for
// the waiter that came after it).
func TestConfirmingTakerKeepsItsTurn(t *testing.T) {
	w := newWorld(t)
	a, b, c := w.dated(0, 0), w.dated(0, 0), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w.advance(5 * time.Second) // expired in server time
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("took over a lock it had not yet seen unchanged for a lease: %+v", res)
	}
	// The waiter arrives a second later: it has seen the lock unchanged
	// for a second less when b's confirmation is due.
	w.advance(time.Second)
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("took over before a lease and the margin on its own clock: %+v", res)
	}
	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waited := waitAsync(wctx, c, req(OpUpgrade, 15*time.Second))
	eventually(t, "the waiter queued", func() bool {
		l, err := a.b.store(ns).Read(ctx, LeaseName("web"))
		return err == nil && len(l.Queue) == 1
	})
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("took over before a lease and the margin on its own clock: %+v", res)
	}
	waitTimers(t, c, 1)
	w.advance(3 * time.Second)
	var res tryResult
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover a lease and the margin after the lock was first seen")
	}
	if res.err != nil {
		t.Fatalf("refused though it came before the waiter: %v", res.err)
	}
	if res.held.Previous == nil || res.held.Previous.Session != dead.Session() {
		t.Errorf("previous = %+v, want the dead holder", res.held.Previous)
	}
	stopWaiting()
	<-waited
}
