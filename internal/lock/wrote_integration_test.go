package lock_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// createUnder creates revision rev of release web as the write fence
// creates helm's next revision under j: inside Carry, the record carrying
// j's record naming rev, the lock told where its gate went (GateWritten)
// and which revision its session wrote (Wrote).
func createUnder(t *testing.T, env *testenv.Env, ns string, j *lock.Held, rev int, status string) {
	t.Helper()
	err := j.Carry(func(rec lock.Record) error {
		rec.Revision = rev
		s, err := rec.Encode()
		if err != nil {
			return err
		}
		sec := stockRecord(ns, "web", rev, status)
		sec.Annotations = map[string]string{lock.AnnotationRecord: s}
		out, err := env.Client.CoreV1().Secrets(ns).Create(context.Background(), sec, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		j.GateWritten(out.ObjectMeta)
		j.Wrote(rev)
		return nil
	})
	if err != nil {
		t.Fatalf("creating revision %d under the lock: %v", rev, err)
	}
}

// TestIntegrationTakerFindsTheLastRevisionWritten (issue 31 item 2): helm's
// upgrade --rollback-on-failure writes revision 3 (the rollback's) under the
// lock taken for revision 2. A holder that renewed after writing revision 3
// and then died is found naming revision 3 by the client that takes its
// lock over, on the release records alone and with the Lease too, and the
// Lease's own record names it. Before, the renewal carried revision 2 to
// the beat, which overrides the gate's in the lock read, and to the Lease:
// the taker found the holder naming revision 2, and recovery took revision
// 3 for stock helm's.
func TestIntegrationTakerFindsTheLastRevisionWritten(t *testing.T) {
	env := testenv.Get(t)
	for _, withLease := range []bool{false, true} {
		name := "release"
		if withLease {
			name = "lease"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ns := env.Namespace(t)
			if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, stockRecord(ns, "web", 1, "deployed"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			const lease = 3 * time.Second
			a, b := newClient(t, env, nil), newClient(t, env, nil)
			holderParts, takerParts := []*lock.Backend{a.release}, []*lock.Backend{b.release}
			if withLease {
				holderParts, takerParts = append(holderParts, a.lease), append(takerParts, b.lease)
			}
			j, err := lock.Acquire(ctx, request(ns, "web", lease), false, nil, holderParts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := j.SetRevision(ctx, 2); err != nil {
				t.Fatal(err)
			}
			createUnder(t, env, ns, j, 2, "pending-upgrade")
			// The upgrade fails (helm marks revision 2 failed) and its
			// rollback creates revision 3.
			createUnder(t, env, ns, j, 3, "pending-rollback")
			// A renewal after the rollback's revision was written; then
			// the holder dies (it renews no more).
			if err := j.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			session := j.Session()
			if withLease {
				if l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, lock.LeaseName("web"), metav1.GetOptions{}); err != nil {
					t.Fatal(err)
				} else if rec, err := lock.DecodeRecord(l.Annotations[lock.AnnotationRecord]); err != nil || rec.Revision != 3 {
					t.Errorf("the Lease's record after the renewal: %+v (%v); want it naming revision 3", rec, err)
				}
			}

			taker, err := lock.Acquire(ctx, request(ns, "web", lease), true, nil, takerParts...)
			if err != nil {
				t.Fatalf("taking the dead holder's lock over: %v", err)
			}
			prev, st := taker.Previous()
			if st != lock.Expired || prev == nil || prev.Session != session {
				t.Fatalf("the taker found %v %+v; want the dead holder %s, expired", st, prev, session)
			}
			if prev.Revision != 3 {
				t.Errorf("the taker found the dead holder naming revision %d; want 3, the last it wrote", prev.Revision)
			}
			if err := taker.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
