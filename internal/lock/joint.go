package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Joint is the set of locks one operation holds under one session: with
// --lock-backend=release the release record's lock alone, with lease that
// lock and then the release's Lease. The release record is what every
// client, whichever backend it chose, takes first, so two clients never hold
// a release at once even when one of them cannot read Leases; the Lease adds
// a lock for a release that has no stored revision yet, a queue that kubectl
// can show, and exclusion of clients that take only the Lease.
type Joint struct {
	parts []*Held
}

// maxJointRetries bounds how often an earlier part is taken again after a
// later one was waited for (a release installed meanwhile turns a virtual
// record lock into a real one held by someone else).
const maxJointRetries = 5

// AcquireJoint takes the lock of every backend in order, for one request and
// one session. With wait false it fails at once when any part is held by a
// live client (releasing the parts it took); with wait true it waits for
// each in turn until ctx ends, keeping every part it holds renewed while it
// waits for another (an earlier one lost meanwhile included). onProgress
// is passed to Backend.Wait; with wait false, it is called when a part
// that expired too recently to be taken at once is waited for (see
// Confirm).
func AcquireJoint(ctx context.Context, req Request, wait bool, onProgress func(*Record, time.Duration), backends ...*Backend) (*Joint, error) {
	if len(backends) == 0 {
		return nil, errors.New("acquire lock: no backend")
	}
	if req.Session == "" {
		req.Session = NewSession()
	}
	held := make([]*Held, len(backends))
	// waited[i] is set once part i had to be waited for (Held.waited), in
	// any of its takes: an earlier part may have been lost meanwhile.
	waited := make([]bool, len(backends))
	// unkeep[i] stops the renewals of part i and waits for them to end;
	// handOver[i] too, once a renewal in flight has its answer.
	unkeep := make([]func(), len(backends))
	handOver := make([]func(), len(backends))
	keep := func(i int) {
		kctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		h := held[i]
		go func() {
			defer close(done)
			h.Keep(kctx, nil)
		}()
		unkeep[i] = func() { cancel(); <-done }
		handOver[i] = func() { h.stopKeeping(cancel); <-done }
	}
	stop := func() {
		for i, u := range unkeep {
			if u != nil {
				u()
				unkeep[i] = nil
			}
		}
	}
	fail := func(err error) (*Joint, error) {
		stop()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for i := len(held) - 1; i >= 0; i-- {
			if h := held[i]; h != nil {
				_ = h.releaseNamingExpired(rctx)
			}
		}
		return nil, err
	}
	take := func(i int) error {
		var h *Held
		var err error
		if i == 0 {
			// A hint comes only from this take of the first part, never
			// from an earlier one (lost since: the newest record may have
			// changed).
			req.nextRevision = 0
		}
		r := req
		if later := backends[i+1:]; len(later) > 0 {
			// A dead holder's later parts are confirmed expired while
			// this one is (see Confirm), not one after the other.
			r.sightLater = func(ctx context.Context) {
				for _, b := range later {
					_, _ = b.Inspect(ctx, req.Namespace, req.Release)
				}
			}
		}
		if wait {
			h, err = backends[i].Wait(ctx, r, onProgress)
		} else {
			r.onConfirm = onProgress
			h, _, err = backends[i].TryAcquire(ctx, r)
		}
		if err != nil {
			return err
		}
		held[i] = h
		waited[i] = waited[i] || h.waited
		if rec := h.Record(); i == 0 && rec.Abandoned == nil && rec.Revision > 0 && req.Revision == 0 {
			// The later parts name the revision the first found.
			req.nextRevision = rec.Revision
		}
		// Every part is renewed from the moment it is taken until the
		// joint lock is handed over: while a later part is awaited, and
		// while an earlier part that was lost is awaited again (the last
		// part included).
		keep(i)
		return nil
	}
	for i := range backends {
		if err := take(i); err != nil {
			return fail(err)
		}
	}
	// A part taken while a later one was awaited may have been lost meanwhile
	// (a virtual record lock whose release was installed by another client):
	// confirm each with a renewal, and take a lost one again. The last part
	// has been kept renewed since it was taken: checking it is enough. Only
	// a part someone else took (or whose lock vanished) is taken again: one
	// lost at its renew deadline is still named ours on the server, and
	// taking it again would queue behind our own session. When no later
	// part had to be waited for (wait false, or each free at its first
	// attempt, as when a waiter's turn comes) the parts were taken one right
	// after the other, each kept renewed since: checking each is enough, as
	// for the last part, and no request is made for it; but a virtual record lock
	// (a release with no record: its take wrote nothing) is read again,
	// since a first revision someone created meanwhile shows nowhere else.
	for range maxJointRetries {
		lost := -1
		for i, h := range held {
			confirm := h.Renew
			if i == len(held)-1 || (!slices.Contains(waited[i+1:], true) && !h.isVirtual()) {
				confirm = func(context.Context) error { return h.Valid() }
			}
			if err := confirm(ctx); err != nil {
				if !errors.Is(err, ErrLost) || !h.isGone() {
					return fail(err)
				}
				lost = i
				break
			}
		}
		if lost < 0 {
			// The session's Keep renews them from here (stopKeeping).
			for i, u := range unkeep {
				if u != nil {
					handOver[i]()
					unkeep[i] = nil
				}
			}
			return &Joint{parts: held}, nil
		}
		// Lock order holds on every take: the parts after the lost one are
		// given back and taken again after it. A client that waited for an
		// earlier part while it held a later one would wait for ever on
		// one that took them in order and waits for the later one.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		for i := len(held) - 1; i > lost; i-- {
			h := held[i]
			unkeep[i]()
			unkeep[i] = nil
			// The retake finds the expired holder named again. A part
			// already lost to someone else (its Lease deleted or
			// force-released) has nothing to give back; on any other
			// failure held[i] stays set, so that fail gives it back once
			// more.
			if err := h.releaseNamingExpired(rctx); err != nil && (!errors.Is(err, ErrLost) || !h.isGone()) {
				cancel()
				return fail(err)
			}
			held[i] = nil
		}
		cancel()
		unkeep[lost]()
		unkeep[lost], held[lost] = nil, nil
		for i := lost; i < len(held); i++ {
			if err := take(i); err != nil {
				return fail(err)
			}
		}
	}
	return fail(fmt.Errorf("lock release %q in namespace %q: its lock kept moving while it was being taken; retry", req.Release, req.Namespace))
}

// GateWritten tells the first part that a write made under the lock was
// accepted (Held.GateWritten).
func (j *Joint) GateWritten(meta metav1.ObjectMeta) { j.parts[0].GateWritten(meta) }

// GateUnsure tells the first part that a write made under the lock may
// have committed unseen (Held.GateUnsure).
func (j *Joint) GateUnsure() { j.parts[0].GateUnsure() }

// Newest is the release's newest record as the first part last read or
// wrote it (Held.Newest).
func (j *Joint) Newest() (name string, rev int, status string, ok bool) {
	return j.parts[0].Newest()
}

// Session is the session ID all parts share.
func (j *Joint) Session() string { return j.parts[0].Session() }

// Record returns the record of the first part (the release record's lock),
// the one written into new revisions.
func (j *Joint) Record() Record { return j.parts[0].Record() }

// Deadline is the earliest renew deadline of the parts (Held.Deadline), on
// the lock's injected local clock: unless a renewal succeeds first, the lock
// must be considered lost from then on, so no write made under it may still
// be in flight then.
func (j *Joint) Deadline() time.Time {
	var d time.Time
	for _, h := range j.parts {
		if hd := h.Deadline(); d.IsZero() || hd.Before(d) {
			d = hd
		}
	}
	return d
}

// Carry runs write with the record of the first part (the one written into
// new revisions) while no write of that part is in flight (Held.Carry).
func (j *Joint) Carry(write func(Record) error) error { return j.parts[0].Carry(write) }

// Valid is nil while every part may still be written under.
func (j *Joint) Valid() error {
	for _, h := range j.parts {
		if err := h.Valid(); err != nil {
			return err
		}
	}
	return nil
}

// Previous returns what was found before the lock was taken, for recovery:
// the record of a part that was Expired (its holder died) if any, the first
// part's when it was, else the one naming the highest revision; otherwise
// the first part's (Free).
//
// A part released by a holder that failed to recover an expired holder's
// revision counts as that expired holder's (see Found). An Expired record is
// HandedOn's copy: marked Stopped when this client confirmed that holder's
// expiry itself, as it was handed on otherwise.
func (j *Joint) Previous() (*Record, State) {
	type found struct {
		rec   *Record
		state State
	}
	var best *found
	for i, h := range j.parts {
		if _, st := Found(h.Previous, h.PreviousState); st != Expired {
			continue
		}
		rec := HandedOn(h.Previous, h.PreviousState)
		if i == 0 {
			// The first part, the release records' lock, is taken first
			// by every client, and its holder is the newest record's: a
			// later part found Expired too is as recent at best (a client
			// of the release backend alone leaves the Lease as an earlier
			// holder left it; the simulation, seed 5070, found such a
			// Lease's stale holder preferred for naming a higher revision,
			// and the revision pending left for stock helm's).
			return rec, Expired
		}
		if best == nil || best.rec == nil || (rec != nil && rec.Revision > best.rec.Revision) {
			best = &found{rec, Expired}
		}
	}
	if best == nil {
		best = &found{j.parts[0].Previous, j.parts[0].PreviousState}
		for _, h := range j.parts {
			if best.rec == nil && h.Previous != nil {
				best = &found{h.Previous, h.PreviousState}
			}
		}
	}
	return best.rec, best.state
}

// ReadFloor is the first part's Held.ReadFloor that is not "".
func (j *Joint) ReadFloor() string {
	for _, h := range j.parts {
		if rv := h.ReadFloor(); rv != "" {
			return rv
		}
	}
	return ""
}

// Renew extends every part by one lease from now; the first error stops it
// (see Held.Renew).
func (j *Joint) Renew(ctx context.Context) error {
	for _, h := range j.parts {
		if err := h.Renew(ctx); err != nil {
			return err
		}
	}
	return nil
}

// SetRevision records the revision being written in every part.
func (j *Joint) SetRevision(ctx context.Context, rev int) error {
	for _, h := range j.parts {
		if err := h.SetRevision(ctx, rev); err != nil {
			return err
		}
	}
	return nil
}

// Wrote tells every part that the session wrote revision rev under the
// lock (Held.Wrote).
func (j *Joint) Wrote(rev int) {
	for _, h := range j.parts {
		h.Wrote(rev)
	}
}

// Release gives every part back, the last taken first.
func (j *Joint) Release(ctx context.Context) error {
	return j.releaseNaming(ctx, func(*Held) *Record { return nil })
}

// ReleaseAbandoning gives every part back, the last taken first, with a
// record naming abandoned (see Held.ReleaseAbandoning): the next client
// treats abandoned as an expired holder and recovers the revision it names
// at once. A holder passes its own record when it cannot resolve a revision
// of its own that helm left pending.
func (j *Joint) ReleaseAbandoning(ctx context.Context, abandoned *Record) error {
	return j.releaseNaming(ctx, func(*Held) *Record { return abandoned })
}

// releaseNaming gives every part back, the last taken first, each with a
// record naming as abandoned the holder abandoned(part) returns (none when
// nil; Held.ReleaseAbandoning).
func (j *Joint) releaseNaming(ctx context.Context, abandoned func(*Held) *Record) error {
	var errs []error
	for i := len(j.parts) - 1; i >= 0; i-- {
		errs = append(errs, j.parts[i].ReleaseAbandoning(ctx, abandoned(j.parts[i])))
	}
	return errors.Join(errs...)
}

// ReleaseAfterFailedRecovery gives every part back after a failed recovery
// of what the previous holder abandoned: each part's record names the
// holder that part itself was found Expired with (see Held.ReleaseAbandoning
// and Found), and no other. A part never names a holder it did not find:
// the release record's lock is the evidence recovery attributes a revision
// by (helmx.Summary.CarriesLockOf), so naming there a holder found only in
// the Lease would attribute to it a revision stock helm wrote after the
// holder stamped the number in its Lease and died.
func (j *Joint) ReleaseAfterFailedRecovery(ctx context.Context) error {
	return j.releaseNaming(ctx, func(h *Held) *Record { return HandedOn(h.Previous, h.PreviousState) })
}

// ReleaseAndDelete gives every part back and removes what is left of it
// (after an uninstall that kept no history).
func (j *Joint) ReleaseAndDelete(ctx context.Context) error {
	var errs []error
	for i := len(j.parts) - 1; i >= 0; i-- {
		err := j.parts[i].ReleaseAndDelete(ctx)
		if errors.Is(err, ErrLost) && j.parts[i].b.store == StoreRelease {
			// helm deleted the records, and the lock with them.
			err = nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Keep renews every part until ctx ends or the locks are released; onLost is
// called once, for the first part lost.
func (j *Joint) Keep(ctx context.Context, onLost func(error)) {
	var once sync.Once
	var wg sync.WaitGroup
	for _, h := range j.parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.Keep(ctx, func(err error) {
				once.Do(func() {
					if onLost != nil {
						onLost(err)
					}
				})
			})
		}()
	}
	wg.Wait()
}
