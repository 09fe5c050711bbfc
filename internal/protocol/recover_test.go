package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestConverges: recovery undoes the abandoned revision before an upgrade,
// an install, or no operation, whatever the strategy (before a rollback
// too: converge keeps what helm's rollback would not).
func TestConverges(t *testing.T) {
	for op, want := range map[lock.Operation]bool{
		lock.OpUpgrade:   true,
		lock.OpInstall:   true,
		lock.OpRecover:   true,
		lock.OpRollback:  false,
		lock.OpUninstall: false,
	} {
		if got := converges(op); got != want {
			t.Errorf("converges(%s) = %v, want %v", op, got, want)
		}
	}
}

// TestDefersRemovals: objects only the abandoned revision rendered wait for
// the revision of an upgrade or install (it may render them again: issue
// 11 item 1); with no operation to follow they go at once.
func TestDefersRemovals(t *testing.T) {
	for op, want := range map[lock.Operation]bool{
		lock.OpUpgrade: true, lock.OpInstall: true,
		lock.OpRecover: false, lock.OpRollback: false, lock.OpUninstall: false,
	} {
		if got := defersRemovals(op); got != want {
			t.Errorf("defersRemovals(%s) = %v, want %v", op, got, want)
		}
	}
	// Nothing deferred: nothing is read (the happy path costs no request).
	var c Conn
	if rep, err := c.RemoveDeferred(context.Background(), &writer{}, nil, nil); err != nil || rep.Notable() {
		t.Errorf("RemoveDeferred(nil) = %+v, %v", rep, err)
	}
}

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// revision is a release record of the secret driver, with an empty manifest.
func revision(t *testing.T, rev int, status common.Status, created time.Time) *corev1.Secret {
	t.Helper()
	doc, err := json.Marshal(map[string]any{
		"name": "web", "namespace": "shop", "version": rev,
		"info":  map[string]any{"status": status, "description": "fixture"},
		"chart": map[string]any{"metadata": map[string]any{"name": "app", "version": "0.1.0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := helmx.EncodeReleaseJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: helmx.ReleaseSecretName("web", rev), Namespace: "shop", ResourceVersion: "10",
			CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{
				helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelName: "web", helmx.LabelVersion: strconv.Itoa(rev),
				helmx.LabelStatus: string(status),
			},
		},
		Type: helmx.ReleaseSecretType,
		Data: map[string][]byte{helmx.ReleaseDataKey: payload},
	}
}

// writer is a Writer whose validity a test sets.
type writer struct{ err error }

func (w *writer) Valid() error    { return w.err }
func (w *writer) Session() string { return "rec-session" }

func (w *writer) SetRevision(context.Context, int) error { return w.err }

func fakeConn(t *testing.T, objs ...runtime.Object) (*Conn, *fake.Clientset) {
	t.Helper()
	c, client, _ := fakeConnClock(t, objs...)
	return c, client
}

func fakeConnClock(t *testing.T, objs ...runtime.Object) (*Conn, *fake.Clientset, *clocktesting.FakeClock) {
	t.Helper()
	client := fake.NewClientset(objs...)
	clk := clocktesting.NewFakeClock(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0.Add(time.Minute))
	return NewConn(client, est, clk, "", nil), client, clk
}

func secretWrites(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "secrets" && (a.GetVerb() == "update" || a.GetVerb() == "create" || a.GetVerb() == "delete") {
			n++
		}
	}
	return n
}

// The dead holder's lock: it was writing revision 2, which it created at t0.
var dead = recovery.LockInfo{State: recovery.LockExpired, Session: "dead", Who: "alice@ci", Operation: "upgrade", Revision: 2, LockedTill: t0.Add(15 * time.Second)}

func TestRecoverProcedure(t *testing.T) {
	ctx := context.Background()
	// Revision 1 never deployed (no converge target): only marking is
	// exercised here; converge has its own tests on a real API server.
	objs := func() []runtime.Object {
		// Revision 2's record carries the dead holder's lock, as its fenced
		// create wrote it, now under the taker's lock naming it abandoned,
		// as the take wrote it.
		r2 := revision(t, 2, common.StatusPendingUpgrade, t0)
		r2.Annotations = map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"rec-session","release":"web","namespace":"shop","abandoned":{"schema":1,"session":"dead","release":"web","namespace":"shop","revision":2}}`}
		return []runtime.Object{revision(t, 1, common.StatusFailed, t0.Add(-time.Hour)), r2}
	}

	t.Run("no writer decides and writes nothing", func(t *testing.T) {
		c, client := fakeConn(t, objs()...)
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade})
		if err != nil || out.Decision.Verdict != recovery.Recover || len(out.Marked) != 0 || out.Latest != 2 {
			t.Fatalf("outcome %+v, err %v; want a Recover decision, nothing marked", out, err)
		}
		if n := secretWrites(client); n != 0 {
			t.Errorf("%d writes without a writer", n)
		}
	})

	t.Run("marks the abandoned revision failed", func(t *testing.T) {
		c, _ := fakeConn(t, objs()...)
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{}})
		if err != nil || len(out.Marked) != 1 || out.Marked[0].Release.Revision != 2 {
			t.Fatalf("outcome %+v, err %v; want revision 2 marked", out, err)
		}
		hist, err := c.History(ctx, "shop", "web")
		if err != nil {
			t.Fatal(err)
		}
		if hist[1].Status != common.StatusFailed || hist[1].Description != out.Marked[0].Description {
			t.Errorf("revision 2 is %s %q; want failed %q", hist[1].Status, hist[1].Description, out.Marked[0].Description)
		}
	})

	t.Run("a lost lock writes nothing", func(t *testing.T) {
		c, client := fakeConn(t, objs()...)
		_, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{err: lock.ErrLost}})
		if !errors.Is(err, lock.ErrLost) {
			t.Fatalf("err %v; want ErrLost", err)
		}
		if n := secretWrites(client); n != 0 {
			t.Errorf("%d writes after the lock was lost", n)
		}
	})

	t.Run("a conflict reads and decides again", func(t *testing.T) {
		c, client := fakeConn(t, objs()...)
		// Another writer resolves revision 2 just before our write lands:
		// the first update conflicts; the second decision finds nothing
		// pending.
		conflicted := false
		client.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if conflicted {
				return false, nil, nil
			}
			conflicted = true
			s := revision(t, 2, common.StatusDeployed, t0)
			s.ResourceVersion = "11"
			if err := client.Tracker().Update(a.GetResource(), s, "shop"); err != nil {
				t.Fatal(err)
			}
			return true, nil, errConflict()
		})
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{}})
		if err != nil || !conflicted || out.Decision.Verdict != recovery.Proceed || len(out.Marked) != 0 {
			t.Fatalf("outcome %+v, err %v, conflicted %v; want Proceed after the conflict, nothing marked", out, err, conflicted)
		}
	})

	t.Run("a holder released early is waited out", func(t *testing.T) {
		// A person released the holder's lock 5 s before its LOCKED TILL
		// (server time is t0+1m here): the holder may still write until
		// then, so recovery waits, holding its own lock, and only then
		// marks the revision failed.
		c, client, clk := fakeConnClock(t, objs()...)
		early := dead
		early.LockedTill = t0.Add(time.Minute + 5*time.Second)
		type result struct {
			out Outcome
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: early, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{}})
			done <- result{out, err}
		}()
		deadline := time.Now().Add(30 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("recovery never waited")
			}
			time.Sleep(time.Millisecond)
		}
		if n := secretWrites(client); n != 0 {
			t.Fatalf("%d writes while the holder may still write", n)
		}
		clk.Step(6 * time.Second)
		r := <-done
		if r.err != nil || len(r.out.Marked) != 1 || r.out.Marked[0].Release.Revision != 2 {
			t.Fatalf("outcome %+v, err %v; want revision 2 marked after the wait", r.out, r.err)
		}
	})

	t.Run("a holder known to have stopped is not waited out", func(t *testing.T) {
		// Its holder stamped LOCKED TILL through a Date header running
		// ahead: the taker confirmed on its own clock that the holder
		// stopped, so the revision is recovered at once.
		c, client := fakeConn(t, objs()...)
		ahead := dead
		ahead.LockedTill, ahead.Stopped = t0.Add(10*time.Minute), true
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: ahead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{}})
		if err != nil || len(out.Marked) != 1 || out.Marked[0].Release.Revision != 2 || secretWrites(client) == 0 {
			t.Fatalf("outcome %+v, err %v; want revision 2 marked at once", out, err)
		}
	})

	t.Run("a record under another's lock is not written", func(t *testing.T) {
		// This client lost its lock between its check and its read (a
		// pause): the newest record carries the taker's lock now (the
		// simulation, seed 24550). Nothing is written; the lock is lost.
		r2 := revision(t, 2, common.StatusPendingUpgrade, t0)
		r2.Annotations = map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"taker","release":"web","namespace":"shop","abandoned":{"schema":1,"session":"dead","release":"web","namespace":"shop","revision":2}}`}
		c, client := fakeConn(t, revision(t, 1, common.StatusFailed, t0.Add(-time.Hour)), r2)
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpRecover, Writer: &writer{}})
		if !errors.Is(err, lock.ErrLost) || len(out.Marked) != 0 || secretWrites(client) != 0 {
			t.Fatalf("outcome %+v, err %v, %d writes; want lock.ErrLost and nothing written", out, err, secretWrites(client))
		}
	})

	t.Run("a live lock is blocked", func(t *testing.T) {
		c, client := fakeConn(t, objs()...)
		live := dead
		live.State = recovery.LockLive
		out, err := c.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: live, Policy: recovery.Policy{Autorecover: true}, Next: lock.OpUpgrade, Writer: &writer{}})
		if err != nil || out.Decision.Verdict != recovery.Blocked || secretWrites(client) != 0 {
			t.Fatalf("outcome %+v, err %v; want Blocked and no write", out, err)
		}
	})
}

func errConflict() error {
	return apierrors.NewConflict(corev1.Resource("secrets"), "sh.helm.release.v1.web.v2", errors.New("changed"))
}
