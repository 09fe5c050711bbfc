// helm's update of a release record, made conditional: read, refused when
// the lock is no longer ours, written with the resourceVersion read and the
// lock annotations kept, and sent again after a transient failure.

package helmx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
)

// maxPutRetries bounds how often an update of a record is read and sent
// again because the lock's own renewal changed the record in between.
const maxPutRetries = 8

// update makes helm's overwrite of a release record conditional and keeps
// the lock on it. status is the status label helm's write carries.
func (f *fenceRT) update(req *http.Request, g *GuardedWrites, name string) (_ *http.Response, status string, _ error) {
	body, err := readBody(req)
	if err != nil {
		return nil, "", fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	d, err := decodeRequest(req, body)
	if err != nil {
		return nil, "", fmt.Errorf("helm-autorecover: refused helm's update of %s of release %q in namespace %q: cannot read its body to keep the lock: %w", name, g.Release, g.Namespace, err)
	}
	status = d.meta.Labels[LabelStatus]
	rev := revisionOf(name, g.Release)
	drained, ended := f.w.updateStarted()
	defer ended()
	var failed *http.Response // the last transient failure's answer
	for attempt := 0; ; attempt++ {
		metas, err := f.listRecords(req, g)
		if err != nil {
			if attempt < maxPutRetries && transientListFailure(req, err) {
				// The fence's own read failed for a moment: helm's
				// update is not sent, and may be ignored if it fails
				// (see below), so read again.
				if werr := sleepCtx(req.Context(), drained, writeBackoff(attempt)); werr == nil {
					continue
				}
			}
			if failed != nil {
				// Helm sees the write's own failure, not the retry's.
				return failed, status, nil
			}
			return nil, status, err
		}
		if err := newestAllows(metas, g); err != nil {
			return nil, status, err
		}
		// The record's metadata (its resourceVersion, the lock on it) comes
		// with the list, which is as current as a read of the record: only
		// a record the list does not name (deleted meanwhile) is read, so
		// that helm sees why.
		cur := metaNamed(metas, name)
		if cur == nil {
			d, resp, err := f.get(req)
			if err != nil || resp != nil {
				return resp, status, err // the read failed: helm sees why
			}
			cur = d.meta
		}
		isNewest := len(metas) > 0 && metas[len(metas)-1].Name == name
		own, curRec, err := checkLock(cur, g, isNewest)
		if err != nil {
			return nil, status, err
		}
		if err := g.Lock.Valid(); err != nil {
			return nil, status, fmt.Errorf("helm-autorecover: refused helm's update of revision %d of release %q in namespace %q: %w", rev, g.Release, g.Namespace, err)
		}
		d.meta.ResourceVersion = cur.ResourceVersion
		d.meta.Annotations = map[string]string{}
		for _, k := range []string{lock.AnnotationRecord, lock.AnnotationQueue} {
			if v, ok := cur.Annotations[k]; ok {
				d.meta.Annotations[k] = v
			}
		}
		if own {
			s, err := g.ownRecord(rev, curRec)
			if err != nil {
				return nil, status, err
			}
			d.meta.Annotations[lock.AnnotationRecord] = s
		}
		out, err := encodeJSON(d)
		if err != nil {
			return nil, status, fmt.Errorf("helm-autorecover: encoding revision %d of release %q: %w", rev, g.Release, err)
		}
		resp, err := f.send(withBody(req, out))
		retry := transientFailure(req, resp, err)
		if !retry && (err != nil || resp.StatusCode != http.StatusConflict) || attempt >= maxPutRetries {
			return resp, status, err
		}
		if resp != nil {
			// Our own renewal (or a waiter queueing) changed the record
			// since it was read, or the server failed for a moment: read
			// it and check the lock again.
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if retry {
			// helm does not send a failed update again, and ignores the
			// failure of some (marking the previous revision superseded:
			// two revisions would then read deployed). The write may have
			// landed: the next one is conditional on a fresh list, and
			// sent only while the lock is valid (its deadline bounds the
			// request's context).
			failed = nil
			if err == nil {
				// Its headers stay behind: a Retry-After would make
				// client-go send helm's whole write again.
				failed = &http.Response{Status: resp.Status, StatusCode: resp.StatusCode, Header: http.Header{}, Body: http.NoBody, Request: resp.Request}
			}
			if werr := sleepCtx(req.Context(), drained, writeBackoff(attempt)); werr != nil {
				// The lock's renew deadline (or helm's own) ended the
				// retries: an error, which the deadline's check in
				// roundTrip reports as the lock's.
				return nil, status, fmt.Errorf("helm-autorecover: helm's update of %s of release %q in namespace %q failed (%s) and could not be sent again in time: %w", name, g.Release, g.Namespace, failureOf(resp, err), werr)
			}
		}
	}
}

// transientFailure tells a failed write that sending again may cure: the
// connection failed, or the server answered 429 or 5xx. A write whose
// context ended (its caller's, or the lock's renew deadline) is not one.
func transientFailure(req *http.Request, resp *http.Response, err error) bool {
	if req.Context().Err() != nil {
		return false
	}
	if err != nil {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lock.ErrLost)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// failureOf says how a write failed: its error, or the server's answer.
func failureOf(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// writeBackoff is the pause before sending a write again after its
// attempt'th try failed for a moment: 100 ms, doubling, at most 2 s.
func writeBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<min(attempt, 5), 2*time.Second)
}

// errDrained ends the retries of an update once the fence is drained.
var errDrained = errors.New("the operation is ending and its lock is being released")

// sleepCtx waits d, or until ctx ends or drained is closed.
func sleepCtx(ctx context.Context, drained <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-drained:
		return errDrained
	case <-t.C:
		return nil
	}
}

// ownRecord is our lock record for revision rev's record, which already
// carries our lock as cur: the newer renewal stamp of the two is kept, so a
// write that read the record between a renewal's commit and its response
// never moves LOCKED TILL back.
func (g *GuardedWrites) ownRecord(rev int, cur *lock.Record) (string, error) {
	rec := g.Lock.Record()
	if cur != nil && cur.Session == rec.Session && cur.RenewedAt.After(rec.RenewedAt) {
		rec.RenewedAt, rec.RenewedAfter, rec.LockedTill = cur.RenewedAt, cur.RenewedAfter, cur.LockedTill
	}
	rec.Revision = rev
	rec = releasestore.GateRecord(rec)
	return rec.Encode()
}
