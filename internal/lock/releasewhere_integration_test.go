package lock_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// countRequests records the method and path of every request it passes on.
type countRequests struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (c *countRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.seen = append(c.seen, r.Method+" "+r.URL.Path)
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

func (c *countRequests) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen[n:]...)
}

// TestIntegrationReleaseWhereLastWritten: a holder on the release store
// whose last fenced write left its lock on a record (part.GateWritten)
// releases with one conditional patch of that record and no read; when the
// record was written since, it reads and judges as before: a record
// rewritten by someone else's harmless write is released all the same, and
// a takeover's gate found there is left alone (the holder's lock is lost).
func TestIntegrationReleaseWhereLastWritten(t *testing.T) {
	env := testenv.Get(t)
	const lease = 15 * time.Second
	for _, tc := range []struct {
		name string
		// since writes the record after the holder's last write; nil: no one.
		since    func(t *testing.T, ns string, other string)
		wantLost bool
		wantOne  bool
	}{
		{name: "untouched", wantOne: true},
		{name: "annotated by someone else since", since: func(t *testing.T, ns, _ string) {
			s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), recordName("web", 2), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Annotations["example.com/note"] = "x"
			if _, err := env.Client.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "taken over since", wantLost: true, since: func(t *testing.T, ns, other string) {
			s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), recordName("web", 2), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC().Truncate(time.Millisecond)
			rec := lock.Record{Schema: lock.SchemaVersion, Session: other, Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: now, RenewedAt: now, LockedTill: now.Add(lease), Revision: 3}
			g := releasestore.GateRecord(rec)
			enc, err := g.Encode()
			if err != nil {
				t.Fatal(err)
			}
			s.Annotations[lock.AnnotationRecord] = enc
			if _, err := env.Client.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			ctx := context.Background()
			if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cr := &countRequests{}
			c := newClient(t, env, func(rt http.RoundTripper) http.RoundTripper { cr.next = rt; return cr })
			h, _, err := c.release.TryAcquire(ctx, request(ns, "web", lease))
			if err != nil {
				t.Fatal(err)
			}
			// What the fence does with helm's create of revision 2: carry
			// the lock into it, and tell the lock what was written.
			err = h.Carry(func(rec lock.Record) error {
				enc, err := (&rec).Encode()
				if err != nil {
					return err
				}
				s := stockRecord(ns, "web", 2, "deployed")
				s.Annotations = map[string]string{lock.AnnotationRecord: enc}
				out, err := env.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				h.GateWritten(out.ObjectMeta)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			other := lock.NewSession()
			if tc.since != nil {
				tc.since(t, ns, other)
			}
			n := len(cr.since(0))
			err = h.Release(ctx)
			reqs := cr.since(n)
			if tc.wantLost {
				if !errors.Is(err, lock.ErrLost) {
					t.Fatalf("release after a takeover: %v, want ErrLost", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if tc.wantOne && (len(reqs) != 1 || !strings.HasPrefix(reqs[0], "PATCH ") || !strings.HasSuffix(reqs[0], "/"+recordName("web", 2))) {
				t.Errorf("release made %v, want one patch of %s", reqs, recordName("web", 2))
			}
			s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, recordName("web", 2), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := lock.DecodeRecord(s.Annotations[lock.AnnotationRecord])
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantLost && (rec.Session != other || !rec.ReleasedAt.IsZero()):
				t.Errorf("the takeover's gate became %+v: the released holder wrote over it", rec)
			case !tc.wantLost && (rec.Session != h.Session() || rec.ReleasedAt.IsZero()):
				t.Errorf("gate after release: %+v, want %s released", rec, h.Session())
			}
		})
	}
}
