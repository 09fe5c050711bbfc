// helm's create of a revision record, rewritten to carry the lock record:
// the pending revision and its lock are one atomic write.

package helmx

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// recordFor is rec, the lock's record, for revision rev's record.
func recordFor(rec lock.Record, rev int) (string, error) {
	rec.Revision = rev
	return rec.Encode()
}

// create adds the lock record to helm's create of a revision record of the
// guarded release.
func (f *fenceRT) create(req *http.Request, g *GuardedWrites) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	d, err := decodeRequest(req, body)
	rev := 0
	if err == nil {
		rev = revisionOf(d.meta.Name, g.Release)
	} else if bytes.Contains(body, []byte(recordPrefix(g.Release))) {
		// Most likely helm's record, in a form this tool cannot read: it
		// would go out without the lock, so it does not go out at all.
		return nil, fmt.Errorf("helm-autorecover: refused helm's create of a record of release %q in namespace %q: cannot read its body to add the lock: %w", g.Release, g.Namespace, err)
	}
	if rev == 0 {
		return f.send(withRawBody(req, body))
	}

	metas, err := f.listRecords(req, g)
	if err != nil {
		return nil, err
	}
	for _, m := range metas {
		if m.Name == d.meta.Name {
			// Another client wrote this revision first (a first install, or
			// an upgrade racing ours on a virtual lock): it holds the
			// release, as an AlreadyExists answer would have said.
			f.w.createConflict.Store(true)
			return nil, fmt.Errorf("helm-autorecover: refused helm's create of %s of release %q in namespace %q: another client wrote it first: %w", m.Name, g.Release, g.Namespace, lock.ErrLocked)
		}
	}
	if err := newestAllows(metas, g); err != nil {
		f.w.createConflict.Store(true) // another session holds the release
		return nil, err
	}
	// The lock's record goes into the new revision while no renewal is in
	// flight (HelmLock.Carry): the copy must not be older than the renewal
	// the holder's deadline counts from.
	var resp *http.Response
	sent := false
	err = g.Lock.Carry(func(rec lock.Record) error {
		s, err := recordFor(rec, rev)
		if err != nil {
			return err
		}
		if d.meta.Annotations == nil {
			d.meta.Annotations = map[string]string{}
		}
		d.meta.Annotations[lock.AnnotationRecord] = s
		out, err := encodeJSON(d)
		if err != nil {
			return fmt.Errorf("helm-autorecover: encoding revision %d of release %q: %w", rev, g.Release, err)
		}
		f.w.mu.Lock()
		f.w.created[rev] = true
		f.w.mu.Unlock()
		sent = true
		resp, err = f.send(withBody(req, out))
		// Told while no release of the lock can run (Carry): a release
		// must not find the lock's last copy where it was before this
		// create.
		f.noteWrite(g, resp, err)
		if n, ok := g.Lock.(RevisionNoter); ok && (err != nil || resp.StatusCode < 400 || resp.StatusCode >= 500) {
			// It may have committed: whoever finds the lock expired
			// must find it naming this revision (Carry holds the record
			// lock's renewals off until it does).
			n.Wrote(rev)
		}
		return err
	})
	if !sent {
		// Refused before it was sent (the lock is no longer valid):
		// nothing of the revision was written.
		return nil, fmt.Errorf("helm-autorecover: refused helm's create of revision %d of release %q in namespace %q: %w", rev, g.Release, g.Namespace, err)
	}
	if err == nil && resp.StatusCode == http.StatusConflict {
		// Another client created it: not ours after all.
		f.w.createConflict.Store(true)
		f.w.mu.Lock()
		delete(f.w.created, rev)
		f.w.mu.Unlock()
		return resp, err
	}
	f.report(g, rev, resp, err, d.meta.Labels[LabelStatus])
	return resp, err
}
