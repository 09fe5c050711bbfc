package helmx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// heldLock is the lock of one session as the fence sees it.
type heldLock struct {
	rec   lock.Record
	valid error
	// deadline is the renew deadline (zero: none); Valid fails once it
	// has passed, as lock.Held's does.
	deadline time.Time
}

func (h *heldLock) Valid() error {
	if !h.deadline.IsZero() && !time.Now().Before(h.deadline) {
		return fmt.Errorf("lock of session %s was not renewed before its renew deadline: %w", h.rec.Session, lock.ErrLost)
	}
	return h.valid
}
func (h *heldLock) Session() string     { return h.rec.Session }
func (h *heldLock) Record() lock.Record { return h.rec }
func (h *heldLock) Deadline() time.Time { return h.deadline }

func (h *heldLock) Carry(write func(lock.Record) error) error {
	if err := h.Valid(); err != nil {
		return err
	}
	return write(h.Record())
}

func newHeld(session string, at time.Time) *heldLock {
	return &heldLock{rec: lock.Record{
		Schema: lock.SchemaVersion, Session: session, Operation: lock.OpUpgrade, Release: "web",
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
		AcquiredAt:    at, RenewedAt: at, LockedTill: at.Add(15 * time.Second),
	}}
}

// fencedDriver returns helm's secret driver on a client whose writes go
// through a fence guarding release "web" in ns under l.
func fencedDriver(t *testing.T, cfg *rest.Config, ns string, l HelmLock) *driver.Secrets {
	t.Helper()
	w := &WriteFence{}
	t.Cleanup(w.Guard(GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: l}))
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return driver.NewSecrets(cs.CoreV1().Secrets(ns))
}

func lockOn(t *testing.T, env *testenv.Env, ns string, rev int) *lock.Record {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), ReleaseSecretName("web", rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := s.Annotations[lock.AnnotationRecord]
	if !ok {
		return nil
	}
	rec, err := lock.DecodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// webRelease is revision rev of release "web" with status st.
func webRelease(rev int, st common.Status) *rspb.Release {
	r := sampleRelease()
	r.Name, r.Version, r.Info.Status = "web", rev, st
	return r
}

func store(t *testing.T, d *driver.Secrets, rev int, st common.Status) error {
	t.Helper()
	return d.Create(ReleaseSecretName("web", rev), webRelease(rev, st))
}

// TestIntegrationFenceBehindPathPrefix: an API server reached through a
// proxy with a path prefix (as Rancher's /k8s/clusters/ID) is fenced too:
// helm's create carries the lock.
func TestIntegrationFenceBehindPathPrefix(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	const prefix = "/k8s/clusters/c-m-test"
	cfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if !strings.HasPrefix(r.URL.Path, prefix+"/") {
			http.Error(w, "no such cluster", http.StatusNotFound)
			return
		}
		r.URL.Path = strings.TrimPrefix(r.URL.Path, prefix)
		forward.ServeHTTP(w, r)
	})
	cfg.Host += prefix

	held := newHeld("prefixed-session", time.Now())
	d := fencedDriver(t, cfg, ns, held)
	if err := store(t, d, 1, common.StatusPendingInstall); err != nil {
		t.Fatalf("create through the prefixed server: %v", err)
	}
	if rec := lockOn(t, env, ns, 1); rec == nil || rec.Session != "prefixed-session" || rec.Revision != 1 {
		t.Fatalf("the record created through %s carries lock %+v; want session prefixed-session, revision 1", prefix, rec)
	}
}

// TestIntegrationFencePrunedRecordKeepsLock: helm pruning the newest record
// (--history-max with the newest not deployed) first moves the lock to the
// record that becomes the newest, so nobody finds the release unlocked.
func TestIntegrationFencePrunedRecordKeepsLock(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	held := newHeld("pruning-session", time.Now())
	d := fencedDriver(t, env.Config, ns, held)
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, plain, 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	taken(t, env, ns, 1, held)
	if err := store(t, d, 2, common.StatusFailed); err != nil {
		t.Fatal(err)
	}
	if rec := lockOn(t, env, ns, 2); rec == nil || rec.Session != "pruning-session" {
		t.Fatalf("revision 2 carries lock %+v", rec)
	}
	if _, err := d.Delete(ReleaseSecretName("web", 2)); err != nil {
		t.Fatalf("helm's delete of the newest record: %v", err)
	}
	if rec := lockOn(t, env, ns, 1); rec == nil || rec.Session != "pruning-session" || !rec.ReleasedAt.IsZero() {
		t.Fatalf("after pruning revision 2, revision 1 carries lock %+v; want ours, unreleased", rec)
	}
	// Deleting an older record moves nothing.
	if err := store(t, d, 3, common.StatusPendingUpgrade); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Delete(ReleaseSecretName("web", 1)); err != nil {
		t.Fatal(err)
	}
	if rec := lockOn(t, env, ns, 3); rec == nil || rec.Session != "pruning-session" {
		t.Fatalf("revision 3 carries lock %+v", rec)
	}
}

// TestIntegrationFenceRefusesWhenAnotherHoldsTheNewest: when the newest
// record carries the lock of a session that took it after ours, helm's
// create and update are refused with ErrLost and nothing is written.
func TestIntegrationFenceRefusesWhenAnotherHoldsTheNewest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	t0 := time.Now()
	ours := newHeld("old-session", t0)
	theirs := newHeld("new-session", t0.Add(20*time.Second))
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, plain, 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	taken(t, env, ns, 1, theirs)
	if err := store(t, fencedDriver(t, env.Config, ns, theirs), 2, common.StatusPendingUpgrade); err != nil {
		t.Fatal(err)
	}
	d := fencedDriver(t, env.Config, ns, ours)
	if err := store(t, d, 3, common.StatusPendingUpgrade); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("create under a lock another session took later: %v; want ErrLost", err)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), ReleaseSecretName("web", 3), metav1.GetOptions{}); err == nil {
		t.Fatalf("revision 3 was written")
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("update of an older record under a lock another session took later: %v; want ErrLost", err)
	}
	// The later session itself writes on.
	if err := store(t, fencedDriver(t, env.Config, ns, theirs), 3, common.StatusPendingUpgrade); err != nil {
		t.Fatalf("the holder's own create: %v", err)
	}
}

// TestIntegrationFenceKeepsNewerRenewal: helm's update of a record that
// already carries a newer renewal of our own lock (written between the
// renewal's commit and its response) never moves LOCKED TILL back.
func TestIntegrationFenceKeepsNewerRenewal(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	t0 := time.Now()
	held := newHeld("renewing-session", t0)
	d := fencedDriver(t, env.Config, ns, held)
	if err := store(t, d, 1, common.StatusPendingInstall); err != nil {
		t.Fatal(err)
	}
	// A renewal committed on the server, not yet seen by the holder.
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), ReleaseSecretName("web", 1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	renewed := held.rec
	renewed.RenewedAt, renewed.LockedTill = t0.Add(5*time.Second), t0.Add(20*time.Second)
	if s.Annotations[lock.AnnotationRecord], err = renewed.Encode(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed)); err != nil {
		t.Fatalf("helm's update: %v", err)
	}
	rec := lockOn(t, env, ns, 1)
	if rec == nil || !rec.RenewedAt.Equal(renewed.RenewedAt) {
		t.Fatalf("the lock after helm's update = %+v; want the newer renewal %s", rec, renewed.RenewedAt)
	}
}

// TestIntegrationFenceIgnoresStaleLockOnOlderRecord: the lock lives on the
// newest record; an older record keeps the record of whoever held the lock
// while it was newest. That stale record decides nothing, whatever its
// times say: helm's supersede of the last deployed revision goes through
// even when the previous holder's estimate of server time stamped its
// acquisition later than ours (two fresh clients, each about a second
// wide). Refusing it made helm mark the new revision deployed beside a
// last deployed revision it could not supersede: two deployed revisions.
func TestIntegrationFenceIgnoresStaleLockOnOlderRecord(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	t0 := time.Now()
	ours := newHeld("next-session", t0)
	previous := newHeld("previous-session", t0.Add(800*time.Millisecond)) // stamped later than ours
	plain := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, plain, 1, common.StatusDeployed); err != nil {
		t.Fatal(err)
	}
	// The previous holder took the lock on revision 1 and created revision
	// 2, then failed and released (on revision 2).
	prevRec := previous.rec
	s, err := prevRec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, env, ns, 1, s)
	prevRec.Revision = 2
	prevRec.ReleasedAt = t0.Add(time.Second)
	if err := store(t, plain, 2, common.StatusFailed); err != nil {
		t.Fatal(err)
	}
	s, err = prevRec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, env, ns, 2, s)
	// We take the lock on revision 2 (the newest), create revision 3 and
	// supersede revision 1.
	ourRec := ours.rec
	s, err = ourRec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, env, ns, 2, s)
	d := fencedDriver(t, env.Config, ns, ours)
	if err := store(t, d, 3, common.StatusPendingUpgrade); err != nil {
		t.Fatalf("our create: %v", err)
	}
	if _, err := d.Get(ReleaseSecretName("web", 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); err != nil {
		t.Fatalf("supersede of revision 1, which carries the previous holder's stale record: %v", err)
	}
	if err := d.Update(ReleaseSecretName("web", 3), webRelease(3, common.StatusDeployed)); err != nil {
		t.Fatalf("our final write: %v", err)
	}
	if rec := lockOn(t, env, ns, 1); rec == nil || rec.Session != "previous-session" {
		t.Errorf("revision 1's record after the supersede: %+v; want the previous holder's kept as it was", rec)
	}
}

// annotate puts the lock record s on revision rev of release "web".
// taken writes l's record onto revision rev, as taking the lock on the
// release's newest record does.
func taken(t *testing.T, env *testenv.Env, ns string, rev int, l HelmLock) {
	t.Helper()
	rec := l.Record()
	s, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, env, ns, rev, s)
}

func annotate(t *testing.T, env *testenv.Env, ns string, rev int, s string) {
	t.Helper()
	ctx := context.Background()
	sec, err := env.Client.CoreV1().Secrets(ns).Get(ctx, ReleaseSecretName("web", rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	sec.Annotations[lock.AnnotationRecord] = s
	if _, err := env.Client.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationFenceForcedOutHolderStops: after a person released our
// lock (unlock --force marks our record released on the newest record),
// helm's next write of ours is refused and the record stays released: the
// forced-out holder never restores its lock by writing.
func TestIntegrationFenceForcedOutHolderStops(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ours := newHeld("forced-session", time.Now())
	d := fencedDriver(t, env.Config, ns, ours)
	if err := store(t, d, 1, common.StatusPendingInstall); err != nil {
		t.Fatalf("our create: %v", err)
	}
	forced := ours.rec
	forced.Revision = 1
	forced.ReleasedAt = time.Now()
	forced.ReleasedBy = "bob@laptop"
	s, err := forced.Encode()
	if err != nil {
		t.Fatal(err)
	}
	annotate(t, env, ns, 1, s)
	if _, err := d.Get(ReleaseSecretName("web", 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("a forced-out holder's update: %v; want ErrLost", err)
	}
	rec := lockOn(t, env, ns, 1)
	if rec == nil || rec.ReleasedAt.IsZero() || rec.ReleasedBy != "bob@laptop" {
		t.Errorf("the lock record after the refused write: %+v; want it still released by bob@laptop", rec)
	}
	if st := env.History(t, ns, "web")[0].Status; st != "pending-install" {
		t.Errorf("revision 1 is %s; want it untouched (pending-install)", st)
	}
}

// TestIntegrationFenceStopsWhenStockHelmDroppedTheLock (issue 11 item 9):
// while we hold the lock, stock helm (which takes none) writes the next
// revision, so the newest record no longer carries our lock. Our helm's
// writes are refused (ErrLost), and none carries our lock back onto the
// release: neither the update of an older record nor the create of a newer
// one.
func TestIntegrationFenceStopsWhenStockHelmDroppedTheLock(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ours := newHeld("dropped-session", time.Now())
	d := fencedDriver(t, env.Config, ns, ours)
	if err := store(t, d, 1, common.StatusDeployed); err != nil {
		t.Fatalf("our create: %v", err)
	}
	stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, stock, 2, common.StatusPendingRollback); err != nil {
		t.Fatalf("stock helm's create: %v", err)
	}
	if _, err := d.Get(ReleaseSecretName("web", 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusSuperseded)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("our update of revision 1 after stock helm wrote revision 2: %v; want ErrLost", err)
	}
	if err := store(t, d, 3, common.StatusPendingUpgrade); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("our create of revision 3 after stock helm wrote revision 2: %v; want ErrLost", err)
	}
	if got := len(env.History(t, ns, "web")); got != 2 {
		t.Errorf("%d revisions; want revision 3 never written", got)
	}
	if st := env.History(t, ns, "web")[0].Status; st != "deployed" {
		t.Errorf("revision 1 is %s; want it untouched (deployed)", st)
	}
	if rec := lockOn(t, env, ns, 2); rec != nil {
		t.Errorf("stock helm's revision 2 carries lock %+v; want none carried back", rec)
	}
}

// TestIntegrationFenceRefusesUpdateAfterStockRollback (review of a cut that
// made helm's update of the holder's own pending revision conditional on
// its create instead of a read): stock helm's rollback does not check for a
// pending revision; it writes a newer deployed revision beside ours, and
// our final update of our pending revision, unchanged since its create,
// must still be refused, or the release ends with two deployed revisions.
func TestIntegrationFenceRefusesUpdateAfterStockRollback(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ours := newHeld("rolled-past-session", time.Now())
	d := fencedDriver(t, env.Config, ns, ours)
	if err := store(t, d, 1, common.StatusPendingUpgrade); err != nil {
		t.Fatalf("our create: %v", err)
	}
	stock := driver.NewSecrets(env.Client.CoreV1().Secrets(ns))
	if err := store(t, stock, 2, common.StatusDeployed); err != nil {
		t.Fatalf("stock helm's rollback: %v", err)
	}
	if err := d.Update(ReleaseSecretName("web", 1), webRelease(1, common.StatusDeployed)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("our final update after stock helm's rollback wrote revision 2: %v; want ErrLost", err)
	}
	deployed := 0
	for _, h := range env.History(t, ns, "web") {
		if h.Status == "deployed" {
			deployed++
		}
	}
	if deployed != 1 {
		t.Errorf("%d deployed revisions; want 1 (stock helm's)", deployed)
	}
}
