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

// Held is the lock one operation holds under one session, over one or
// more stores, taken in order (Acquire): with --lock-backend=release the
// lock on the release's records (or the sql driver's lock row) alone, with
// lease that lock and then the release's Lease. The first store is what
// every client, whichever backend it chose, takes first, so two clients
// never hold a release at once even when one of them cannot read Leases;
// the Lease adds a lock for a release that has no stored revision yet (the
// record lock is then virtual: its take writes nothing), a queue that
// kubectl can show, and exclusion of clients that take only the Lease. Each store's share is a part; Held is the only
// held-lock type the engine hands out.
type Held struct {
	parts []*part
}

// maxRetakes bounds how often an earlier part is taken again after a
// later one was waited for (a release installed meanwhile turns a virtual
// record lock into a real one held by someone else).
const maxRetakes = 5

// Acquire takes the lock of every backend in order, for one request and
// one session. With wait false it fails at once when any part is held by a
// live client (releasing the parts it took); with wait true it waits for
// each in turn until ctx ends, keeping every part it holds renewed while it
// waits for another (an earlier one lost meanwhile included). onProgress
// is passed to Backend.Wait; with wait false, it is called when a part
// that expired too recently to be taken at once is waited for (see
// Confirm).
//
// A part taken while a later one was awaited may have been lost meanwhile
// (a virtual record lock whose release was installed by another client):
// once all are taken each is confirmed (lostPart), and a lost one is taken
// again, with every part after it given back first and taken again after
// it. Lock order holds on every take: a client that waited for an earlier
// part while it held a later one would wait for ever on one that took them
// in order and waits for the later one.
func Acquire(ctx context.Context, req Request, wait bool, onProgress func(*Record, time.Duration), backends ...*Backend) (*Held, error) {
	if len(backends) == 0 {
		return nil, errors.New("acquire lock: no backend")
	}
	if req.Session == "" {
		req.Session = NewSession()
	}
	a := &acquisition{
		req: req, wait: wait, onProgress: onProgress, backends: backends,
		held: make([]*part, len(backends)), waited: make([]bool, len(backends)),
		unkeep: make([]func(), len(backends)), handOvers: make([]func(), len(backends)),
	}
	from := 0
	for range maxRetakes + 1 {
		for i := from; i < len(backends); i++ {
			if err := a.take(ctx, i); err != nil {
				return a.fail(ctx, err)
			}
		}
		lost, err := a.lostPart(ctx)
		if err != nil {
			return a.fail(ctx, err)
		}
		if lost < 0 {
			// The session's Keep renews them from here (part.stopKeeping).
			a.handOver()
			return &Held{parts: a.held}, nil
		}
		if err := a.giveBackFrom(ctx, lost); err != nil {
			return a.fail(ctx, err)
		}
		from = lost
	}
	return a.fail(ctx, fmt.Errorf("lock release %q in namespace %q: its lock kept moving while it was being taken; retry", req.Release, req.Namespace))
}

// acquisition is one Acquire under way: the parts taken so far, in the
// order of the stores, each renewed from the moment it is taken until the
// lock is handed over (while a later part is awaited, and while an earlier
// part that was lost is awaited again).
type acquisition struct {
	req        Request
	wait       bool
	onProgress func(*Record, time.Duration)
	backends   []*Backend
	held       []*part
	// waited[i] is set once part i had to be waited for (part.waited), in
	// any of its takes: an earlier part may have been lost meanwhile.
	waited []bool
	// unkeep[i] stops the renewals of part i and waits for them to end;
	// handOvers[i] too, once a renewal in flight has its answer.
	unkeep, handOvers []func()
}

// take takes part i, and keeps it renewed.
func (a *acquisition) take(ctx context.Context, i int) error {
	if i == 0 {
		// A hint comes only from this take of the first part, never
		// from an earlier one (lost since: the newest record may have
		// changed).
		a.req.nextRevision = 0
	}
	r := a.req
	if later := a.backends[i+1:]; len(later) > 0 {
		// A dead holder's later parts are confirmed expired while
		// this one is (see Confirm), not one after the other.
		r.sightLater = func(ctx context.Context) {
			for _, b := range later {
				_, _ = b.Inspect(ctx, a.req.Namespace, a.req.Release)
			}
		}
	}
	var h *part
	var err error
	if a.wait {
		h, err = a.backends[i].Wait(ctx, r, a.onProgress)
	} else {
		r.onConfirm = a.onProgress
		h, _, err = a.backends[i].TryAcquire(ctx, r)
	}
	if err != nil {
		return err
	}
	a.held[i] = h
	a.waited[i] = a.waited[i] || h.waited
	if rec := h.Record(); i == 0 && rec.Abandoned == nil && rec.Revision > 0 && a.req.Revision == 0 {
		// The later parts name the revision the first found.
		a.req.nextRevision = rec.Revision
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Keep(kctx, nil)
	}()
	a.unkeep[i] = func() { cancel(); <-done }
	a.handOvers[i] = func() { h.stopKeeping(cancel); <-done }
	return nil
}

// handOver stops the renewals of every part taken, each once a renewal in
// flight has its answer: the lock's holder renews them from then on.
func (a *acquisition) handOver() {
	for i, u := range a.unkeep {
		if u != nil {
			a.handOvers[i]()
			a.unkeep[i], a.handOvers[i] = nil, nil
		}
	}
}

// stopKeeping stops the renewals of every part taken.
func (a *acquisition) stopKeeping() {
	for i := range a.unkeep {
		a.stopKeepingPart(i)
	}
}

func (a *acquisition) stopKeepingPart(i int) {
	if u := a.unkeep[i]; u != nil {
		u()
		a.unkeep[i] = nil
	}
}

// fail gives back every part taken, the last first, and returns err.
func (a *acquisition) fail(ctx context.Context, err error) (*Held, error) {
	a.stopKeeping()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for i := len(a.held) - 1; i >= 0; i-- {
		if h := a.held[i]; h != nil {
			_ = h.releaseNamingExpired(rctx)
		}
	}
	return nil, err
}

// lostPart confirms every part taken and returns the first one someone
// else took (or whose lock vanished) meanwhile, -1 when none. Only such a
// part is taken again: one lost at its renew deadline is still named ours
// on the server, and taking it again would queue behind our own session.
// The last part has been kept renewed since it was taken: checking it is
// enough. When no later part had to be waited for (wait false, or each
// free at its first attempt, as when a waiter's turn comes) the parts were
// taken one right after the other, each kept renewed since: checking each
// is enough, as for the last part, and no request is made for it; but a
// virtual record lock (a release with no record: its take wrote nothing)
// is read again, since a first revision someone created meanwhile shows
// nowhere else.
func (a *acquisition) lostPart(ctx context.Context) (int, error) {
	for i, h := range a.held {
		var err error
		if i == len(a.held)-1 || (!slices.Contains(a.waited[i+1:], true) && !h.isVirtual()) {
			err = h.Valid()
		} else {
			err = h.Renew(ctx)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrLost) || !h.isGone() {
			return -1, err
		}
		return i, nil
	}
	return -1, nil
}

// giveBackFrom gives back part lost and every part after it, the last
// first, to be taken again in order.
func (a *acquisition) giveBackFrom(ctx context.Context, lost int) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for i := len(a.held) - 1; i > lost; i-- {
		a.stopKeepingPart(i)
		// The retake finds the expired holder named again. A part
		// already lost to someone else (its Lease deleted or
		// force-released) has nothing to give back; on any other
		// failure held[i] stays set, so that fail gives it back once
		// more.
		if err := a.held[i].releaseNamingExpired(rctx); err != nil && (!errors.Is(err, ErrLost) || !a.held[i].isGone()) {
			return err
		}
		a.held[i] = nil
	}
	a.stopKeepingPart(lost)
	a.held[lost] = nil
	return nil
}

// GateWritten tells the first part that a write made under the lock was
// accepted (part.GateWritten).
func (j *Held) GateWritten(meta metav1.ObjectMeta) { j.parts[0].GateWritten(meta) }

// GateUnsure tells the first part that a write made under the lock may
// have committed unseen (part.GateUnsure).
func (j *Held) GateUnsure() { j.parts[0].GateUnsure() }

// Newest is the release's newest record as the first part last read or
// wrote it (part.Newest).
func (j *Held) Newest() (name string, rev int, status string, ok bool) {
	return j.parts[0].Newest()
}

// Session is the session ID all parts share.
func (j *Held) Session() string { return j.parts[0].Session() }

// Record returns the record of the first part (the release record's lock),
// the one written into new revisions.
func (j *Held) Record() Record { return j.parts[0].Record() }

// Deadline is the earliest renew deadline of the parts (part.Deadline), on
// the lock's injected local clock: unless a renewal succeeds first, the lock
// must be considered lost from then on, so no write made under it may still
// be in flight then.
func (j *Held) Deadline() time.Time {
	var d time.Time
	for _, h := range j.parts {
		if hd := h.Deadline(); d.IsZero() || hd.Before(d) {
			d = hd
		}
	}
	return d
}

// Carry runs write with the record of the first part (the one written into
// new revisions) while no write of that part is in flight (part.Carry).
func (j *Held) Carry(write func(Record) error) error { return j.parts[0].Carry(write) }

// Valid is nil while every part may still be written under.
func (j *Held) Valid() error {
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
func (j *Held) Previous() (*Record, State) {
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

// ReadFloor is the first part's part.ReadFloor that is not "".
func (j *Held) ReadFloor() string {
	for _, h := range j.parts {
		if rv := h.ReadFloor(); rv != "" {
			return rv
		}
	}
	return ""
}

// Renew extends every part by one lease from now; the first error stops it
// (see part.Renew).
func (j *Held) Renew(ctx context.Context) error {
	for _, h := range j.parts {
		if err := h.Renew(ctx); err != nil {
			return err
		}
	}
	return nil
}

// SetRevision records the revision being written in every part.
func (j *Held) SetRevision(ctx context.Context, rev int) error {
	for _, h := range j.parts {
		if err := h.SetRevision(ctx, rev); err != nil {
			return err
		}
	}
	return nil
}

// Wrote tells every part that the session wrote revision rev under the
// lock (part.Wrote).
func (j *Held) Wrote(rev int) {
	for _, h := range j.parts {
		h.Wrote(rev)
	}
}

// Release gives every part back, the last taken first.
func (j *Held) Release(ctx context.Context) error {
	return j.releaseNaming(ctx, func(*part) *Record { return nil })
}

// ReleaseAbandoning gives every part back, the last taken first, with a
// record naming abandoned (see part.ReleaseAbandoning): the next client
// treats abandoned as an expired holder and recovers the revision it names
// at once. A holder passes its own record when it cannot resolve a revision
// of its own that helm left pending.
func (j *Held) ReleaseAbandoning(ctx context.Context, abandoned *Record) error {
	return j.releaseNaming(ctx, func(*part) *Record { return abandoned })
}

// releaseNaming gives every part back, the last taken first, each with a
// record naming as abandoned the holder abandoned(part) returns (none when
// nil; part.ReleaseAbandoning).
func (j *Held) releaseNaming(ctx context.Context, abandoned func(*part) *Record) error {
	var errs []error
	for i := len(j.parts) - 1; i >= 0; i-- {
		errs = append(errs, j.parts[i].ReleaseAbandoning(ctx, abandoned(j.parts[i])))
	}
	return errors.Join(errs...)
}

// ReleaseAfterFailedRecovery gives every part back after a failed recovery
// of what the previous holder abandoned: each part's record names the
// holder that part itself was found Expired with (see part.ReleaseAbandoning
// and Found), and no other. A part never names a holder it did not find:
// the release record's lock is the evidence recovery attributes a revision
// by (helmx.Summary.CarriesLockOf), so naming there a holder found only in
// the Lease would attribute to it a revision stock helm wrote after the
// holder stamped the number in its Lease and died.
func (j *Held) ReleaseAfterFailedRecovery(ctx context.Context) error {
	return j.releaseNaming(ctx, func(h *part) *Record { return HandedOn(h.Previous, h.PreviousState) })
}

// ReleaseAndDelete gives every part back and removes what is left of it
// (after an uninstall that kept no history).
func (j *Held) ReleaseAndDelete(ctx context.Context) error {
	var errs []error
	for i := len(j.parts) - 1; i >= 0; i-- {
		err := j.parts[i].ReleaseAndDelete(ctx)
		if errors.Is(err, ErrLost) && j.parts[i].b.kind == StoreRelease {
			// helm deleted the records, and the lock with them.
			err = nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Keep renews every part until ctx ends or the locks are released; onLost is
// called once, for the first part lost.
func (j *Held) Keep(ctx context.Context, onLost func(error)) {
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
