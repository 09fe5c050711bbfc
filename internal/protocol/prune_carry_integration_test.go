package protocol

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func lockOnRevision(t *testing.T, env *testenv.Env, ns string, rev int) *lock.Record {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), helmx.ReleaseSecretName("web", rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := lock.DecodeRecord(s.Annotations[lock.AnnotationRecord])
	if err != nil {
		t.Fatalf("lock on revision %d: %v", rev, err)
	}
	return rec
}

// TestIntegrationPruneMovesLockAndDeletesUnderOneCarry: helm prunes the
// newest record (revision 2, failed, where the lock is; --history-max with
// an older revision deployed). The fence moves the lock onto revision 1,
// then sends helm's delete of revision 2. A renewal that starts between the
// two would commit on revision 2 and be deleted with it, leaving revision 1
// (the record that then counts) with an older LOCKED TILL than the holder
// goes by: another client could take over while the holder still writes,
// and the holder's next renewal would call its own lock vanished (found by
// review). The move and the delete go out under one Carry, so a renewal
// started in between lands after the delete, on revision 1.
func TestIntegrationPruneMovesLockAndDeletesUnderOneCarry(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns) // revision 1 deployed
	ctx := context.Background()
	c := settleConn(t, env.Config)
	l := settleAcquire(t, c, ns)
	defer func() { _ = l.Release(ctx) }()
	if err := l.SetRevision(ctx, 2); err != nil {
		t.Fatal(err)
	}

	var armed atomic.Bool
	renewed := make(chan error, 1)
	del2 := helmx.ReleaseSecretName("web", 2)
	helmCfg := settleProxy(t, env, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/"+del2) && armed.CompareAndSwap(true, false) {
			// The keeper's renewal starts as helm's delete goes out, and
			// the delete is held until that renewal is done: were the
			// two not under one Carry, the renewal would commit on
			// revision 2 first. Under one Carry the renewal waits for the
			// delete, so the hold ends at its bound and the renewal lands
			// on revision 1 afterwards.
			done := make(chan error, 1)
			go func() { done <- l.Renew(ctx) }()
			go func() { renewed <- <-done }()
			select {
			case err := <-done:
				done <- err
			case <-time.After(3 * time.Second):
			}
		}
		return false
	}, nil)

	w := &helmx.WriteFence{}
	defer w.Guard(helmx.GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: l})()
	cs, err := kubernetes.NewForConfig(w.Wrap(helmCfg))
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	if err := d.Create(del2, settleRelease(ns, 2, common.StatusFailed)); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil { // the lock is now on revision 2
		t.Fatal(err)
	}
	armed.Store(true)
	if _, err := d.Delete(del2); err != nil { // helm's prune of revision 2
		t.Fatalf("helm's prune of revision 2: %v", err)
	}
	if err := <-renewed; err != nil {
		t.Fatalf("the renewal that started with the delete: %v", err)
	}
	held := l.Record()
	if on1 := lockOnRevision(t, env, ns, 1); on1.Session != held.Session {
		t.Fatalf("revision 1 (the record that counts) carries session %s; the holder is %s", on1.Session, held.Session)
	}
	_, stores, err := c.Stores(ctx, ns, BackendRelease)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Inspect(ctx, ns, "web", stores)
	if err != nil || st.State != lock.Live || st.Record == nil || !st.Record.LockedTill.Equal(held.LockedTill) {
		t.Fatalf("the lock as judged = %+v, %v; the holder goes by LOCKED TILL %s", st, err, held.LockedTill)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("the next renewal: %v (nobody else touched the lock)", err)
	}
}
