// helm's delete of a release record: when it prunes the newest record, the
// lock is first moved onto the next newest.

package helmx

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// deleteRecord sends helm's delete of record name of the guarded release,
// refused as any write is when the lock on the newest record is no longer
// ours. When name is the newest record (helm prunes history beyond
// --history-max, and may prune the newest record when it is not the last
// deployed one), the lock is kept: its annotations are first written onto
// the next newest record, conditional on that record's resourceVersion, so
// that nobody finds the release unlocked in between. The move and the
// delete are sent under one HelmLock.Carry: a renewal landing between them
// would extend the lock only on the record being deleted, leaving the copy
// that then counts older than the deadline the holder goes by.
func (f *fenceRT) deleteRecord(req *http.Request, g *GuardedWrites, name string) (*http.Response, error) {
	metas, err := f.listRecords(req, g)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if err := newestAllows(metas, g); err != nil {
		closeBody(req)
		return nil, err
	}
	n := len(metas)
	if n < 2 || metas[n-1].Name != name {
		return f.send(req) // not the newest, or the last one (uninstall): nothing to move
	}
	next := metas[n-2].Name
	failed := func(what string) error {
		return fmt.Errorf("helm-autorecover: moving the lock of release %q in namespace %q to %s before helm deletes %s: %s", g.Release, g.Namespace, next, name, what)
	}
	getReq := req.Clone(req.Context())
	getReq.URL = withLastSegment(req.URL, next)
	for attempt := 0; attempt < maxPutRetries; attempt++ {
		cur, resp, err := f.get(getReq)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		if resp != nil {
			_ = resp.Body.Close()
			closeBody(req)
			return nil, failed(resp.Status)
		}
		if cur.meta.Annotations == nil {
			cur.meta.Annotations = map[string]string{}
		}
		for _, k := range []string{lock.AnnotationRecord, lock.AnnotationQueue} {
			if v, ok := metas[n-1].Annotations[k]; ok {
				cur.meta.Annotations[k] = v
			} else {
				delete(cur.meta.Annotations, k)
			}
		}
		var del *http.Response
		moved := false
		err = g.Lock.Carry(func(rec lock.Record) error {
			s, err := recordFor(rec, revisionOf(next, g.Release))
			if err != nil {
				return err
			}
			cur.meta.Annotations[lock.AnnotationRecord] = s
			body, err := encodeJSON(cur)
			if err != nil {
				return err
			}
			put := withBody(getReq, body)
			put.Method = http.MethodPut
			resp, err := f.send(put)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusConflict:
				return nil // read next again and retry
			case resp.StatusCode/100 != 2:
				return failed(resp.Status)
			}
			moved = true
			del, err = f.send(req)
			return err
		})
		switch {
		case moved:
			return del, err
		case err != nil:
			closeBody(req)
			return nil, err
		}
	}
	closeBody(req)
	return nil, failed("it kept changing")
}

// withLastSegment returns u with its last path segment replaced by name.
func withLastSegment(u *url.URL, name string) *url.URL {
	out := *u
	out.Path = u.Path[:strings.LastIndex(u.Path, "/")+1] + name
	out.RawPath = ""
	out.RawQuery = ""
	return &out
}
