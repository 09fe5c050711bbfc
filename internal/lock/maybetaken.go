package lock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// errMaybeCommitted marks the failure of a take whose write may have
// committed all the same: its answer was lost (a timeout, a 5xx, a broken
// connection), not a refusal.
var errMaybeCommitted = errors.New("the write may have committed")

// maybeWrite is a take of the lock (create or conditional update) whose
// outcome is unknown: sent is the local instant it was sent, not later
// than its request left; rec the record it wrote; prev and prevState what
// it took over.
type maybeWrite struct {
	sent      time.Time
	rec       Record
	prev      *Record
	prevState State
}

// maybeTaken remembers the takes of one acquisition whose outcome is
// unknown, so that finding its own session as the holder later is
// recognised as its own lock (adopted) rather than another's (waited for).
type maybeTaken struct {
	writes []maybeWrite
}

// mayHaveCommitted tells a write's failure that leaves the write's outcome
// unknown (no answer, a timeout, a server error) from a refusal.
func mayHaveCommitted(err error) bool {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := int(st.Status().Code)
		return code == 0 || code == http.StatusRequestTimeout || code >= 500
	}
	// A transport error or a cancelled request: it may have reached the
	// server.
	return true
}

// note records w when err leaves its outcome unknown, and returns err,
// marked with errMaybeCommitted in that case.
func (m *maybeTaken) note(err error, w maybeWrite) error {
	if m == nil || !mayHaveCommitted(err) {
		return err
	}
	m.writes = append(m.writes, w)
	return fmt.Errorf("%w (%w)", err, errMaybeCommitted)
}

func (m *maybeTaken) any() bool { return m != nil && len(m.writes) > 0 }

// committed returns the write that stored rec (nil when unknown): the one
// that wrote the same RenewedAt, the earliest sent when several did. When
// none matches, it is the earliest sent of all, whose send time bounds any
// of theirs from below.
func (m *maybeTaken) committed(rec *Record) maybeWrite {
	var best *maybeWrite
	for pass := range 2 {
		for i := range m.writes {
			w := &m.writes[i]
			if pass == 0 && (rec == nil || !w.rec.RenewedAt.Equal(rec.RenewedAt)) {
				continue
			}
			if best == nil || w.sent.Before(best.sent) {
				best = w
			}
		}
		if best != nil {
			break
		}
	}
	return *best
}

// adopt makes a part of the lock v, which names this session as holder
// because one of the takes in m committed although its answer was lost.
// Its renew deadline is never later than that of a holder whose write
// committed as it was sent: the send time of the write that stored the
// record found (the earliest of the unknown ones when it cannot be told)
// plus the lease less the renew margin, and no later than the record's
// LOCKED TILL less the margin mapped onto the local clock with the upper
// bound of server time. Previous is what that write took over.
//
// A lock of ours that has already expired (the answer was lost long ago) is
// taken again with a fresh write, as what that write took over.
func (b *Backend) adopt(ctx context.Context, req *Request, v view, now servertime.Bounds, m *maybeTaken) (*part, error) {
	rec := v.rec
	if v.recErr != nil || rec == nil || rec.Session != req.Session || !rec.ReleasedAt.IsZero() {
		rec = nil
	}
	w := m.committed(rec)
	if v.state != Live {
		return b.take(ctx, req, view{snap: v.snap, rec: w.prev, state: w.prevState, live: v.live, queue: v.queue}, m)
	}
	if rec == nil {
		// Our session holds it but its record cannot be read: what we
		// wrote stands in.
		r := w.rec
		rec = &r
	}
	h := b.newHeld(req, v.snap, *rec, w.sent, w.prev, w.prevState)
	if !rec.LockedTill.IsZero() {
		// The local instant first, then the bounds read after it (not
		// those of the attempt): the cap is never late by the time in
		// between.
		local := b.clock.Now()
		if fresh, ok := b.time.Now(); ok {
			now = fresh
		}
		if d := local.Add(rec.LockedTill.Sub(now.Latest) - b.renewMargin()); d.Before(h.deadline) {
			h.deadline = d
		}
	}
	return h, nil
}
