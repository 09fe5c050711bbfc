package lock

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestTakeReadsOnce: a take of a free record lock reads the newest record's
// metadata and the beat once (the Get: one list, which shows the beat when
// there is one), claims the beat, checks the anchor is still the newest
// record (a metadata list), then writes the gate (its full record read for
// the write, the fake client making no patches): five requests, no read of
// the beat by name.
func TestTakeReadsOnce(t *testing.T) {
	w := newRWorld(t)
	n := len(w.cs.Actions())
	h, _, err := w.b.TryAcquire(context.Background(), req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	verbs := w.verbsSince(n)
	if want := []string{"list", "create", "list", "get", "update"}; !slices.Equal(verbs, want) {
		t.Errorf("the take made %v, want %v (list, create the beat, list, get the gate, put the gate)", verbs, want)
	}
	gate, err := w.cs.CoreV1().Secrets(ns).Get(context.Background(), "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := DecodeRecord(gate.Annotations[AnnotationRecord])
	if err != nil || rec.Session != h.Session() {
		t.Fatalf("the gate names %+v (%v), want session %s", rec, err, h.Session())
	}
}

// TestTakeFromStaleReadConflicts: what Get read is used by the take that
// follows only while it holds: a beat written in between makes the take's
// beat write conflict, and a gate written in between its gate write; in
// both cases the gate keeps the other writer's record, and a fresh read
// follows.
func TestTakeFromStaleReadConflicts(t *testing.T) {
	for _, c := range []struct {
		name    string
		between func(t *testing.T, w *rworld)
	}{
		{"beat written in between", func(t *testing.T, w *rworld) {
			bt := w.beat(t)
			bt.Annotations["other"] = "x"
			if _, err := w.cs.CoreV1().Secrets(ns).Update(context.Background(), bt, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"gate written in between", func(t *testing.T, w *rworld) {
			g, err := w.cs.CoreV1().Secrets(ns).Get(context.Background(), "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g.Annotations = map[string]string{"other": "x"}
			if _, err := w.cs.CoreV1().Secrets(ns).Update(context.Background(), g, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRWorld(t)
			ctx := context.Background()
			w.takeAndRelease(t) // so that a beat exists
			st := w.b.store(ns)
			seen, err := st.Read(ctx, LeaseName("web"))
			if err != nil {
				t.Fatal(err)
			}
			c.between(t, w)
			before, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			r := req(OpUpgrade, 15*time.Second)
			r.Session = "taker"
			now, _ := w.b.time.Now()
			rec := newRecord(&r, now)
			_, err = st.Take(ctx, seen, rec, nil)
			if !apierrors.IsConflict(err) {
				t.Fatalf("take from a stale read: %v, want a conflict", err)
			}
			after, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			if after.ResourceVersion != before.ResourceVersion {
				t.Errorf("the gate was written from a stale read")
			}
			// A second take from the same stale read conflicts again,
			// and writes no gate either.
			_, err = st.Take(ctx, seen, rec, nil)
			if !apierrors.IsConflict(err) {
				t.Fatalf("second take from the stale view: %v, want a conflict", err)
			}
			again, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			if again.ResourceVersion != before.ResourceVersion {
				t.Errorf("the gate was written from a stale read the second time")
			}
		})
	}
}

// TestTakeNamesNextRevision: a take of a record lock whose newest revision
// is settled names the revision the operation writes next (the Lease taken
// after it names it too, and its SetRevision then writes nothing,
// TestJointNamesNextRevision); a pending newest revision (to be recovered
// first), an uninstall and a recovery name none, and a different revision
// is written.
func TestTakeNamesNextRevision(t *testing.T) {
	for _, c := range []struct {
		name   string
		status string
		op     Operation
		want   int
	}{
		{"upgrade over deployed", "deployed", OpUpgrade, 2},
		{"rollback over failed", "failed", OpRollback, 2},
		{"install over uninstalled", "uninstalled", OpInstall, 2},
		{"upgrade over pending", "pending-upgrade", OpUpgrade, 0},
		{"uninstall", "deployed", OpUninstall, 0},
		{"recover", "deployed", OpRecover, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRWorld(t)
			ctx := context.Background()
			g, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
			g.Labels["status"] = c.status
			if _, err := w.cs.CoreV1().Secrets(ns).Update(ctx, g, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h, _, err := w.b.TryAcquire(ctx, req(c.op, 15*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Record().Revision; got != c.want {
				t.Fatalf("the take named revision %d, want %d", got, c.want)
			}
			if c.want == 0 {
				return
			}
			n := len(w.cs.Actions())
			if err := h.SetRevision(ctx, c.want); err != nil {
				t.Fatal(err)
			}
			if got := w.cs.Actions()[n:]; len(got) != 0 {
				t.Errorf("SetRevision of the revision the take named made %d requests, want none: %v", len(got), got)
			}
			// The take's claim is left, naming the record it was made
			// against: the gate it wrote there since.
			if on := w.beat(t).Annotations[Stores.AnnotationClaimedOn]; !strings.HasPrefix(on, "sh.helm.release.v1.web.v1@") {
				t.Errorf("the beat left by the take is claimed on %q, want the record it took", on)
			}
			n = len(w.cs.Actions())
			if err := h.SetRevision(ctx, c.want+1); err != nil {
				t.Fatal(err)
			}
			if got := len(w.cs.Actions()) - n; got == 0 {
				t.Error("naming another revision wrote nothing")
			}
			if got := h.Record().Revision; got != c.want+1 {
				t.Errorf("record names revision %d after SetRevision(%d)", got, c.want+1)
			}
		})
	}
}

// TestJointNamesNextRevision: the Lease, taken after the record lock, names
// the revision the record lock found, so the joint SetRevision of it does
// not write at all (part.SetRevision).
func TestJointNamesNextRevision(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	est := servertime.New(w.clk)
	est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
	lb := fakeClocked(NewLeaseBackend(w.cs, est, w.clk))
	lb.Margin = time.Second
	j, err := Acquire(ctx, req(OpUpgrade, 15*time.Second), false, nil, w.b, lb)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range j.parts {
		if got := h.Record().Revision; got != 2 {
			t.Errorf("part %d names revision %d, want 2", i, got)
		}
	}
	l, err := w.cs.CoordinationV1().Leases(ns).Get(ctx, LeaseName("web"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := DecodeRecord(l.Annotations[AnnotationRecord]); err != nil || rec.Revision != 2 {
		t.Errorf("the stored Lease names %+v (%v), want revision 2", rec, err)
	}
	n := len(w.cs.Actions())
	if err := j.SetRevision(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := w.cs.Actions()[n:]; len(got) != 0 {
		t.Errorf("the joint SetRevision of the named revision made %d requests, want none: %v", len(got), got)
	}
}

// TestTakeLandsOnlyOnNewest: a record created (by stock helm, say) between
// a take's Get and its writes makes the take from that Get conflict: the
// lock is taken on the newest record, and a second taker is refused.
func TestTakeLandsOnlyOnNewest(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	w.takeAndRelease(t)
	fired := false
	w.cs.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.UpdateAction).GetObject().(metav1.Object); !fired && ok && o.GetName() == LeaseName("web") {
			// After the Get's read (one list returns the records and the
			// beat), just before the beat is claimed.
			fired = true
			w.s.mu.Lock()
			w.s.rv++
			o := recSecret(2, "pending-upgrade", nil)
			o.ResourceVersion = strconv.Itoa(w.s.rv)
			w.s.objs[o.Name] = o
			w.s.mu.Unlock()
		}
		return false, nil, nil
	})
	ra := req(OpUpgrade, 15*time.Second)
	ra.Session = "A"
	a, _, err := w.b.TryAcquire(ctx, ra)
	if err != nil {
		t.Fatalf("A's take: %v", err)
	}
	if got := a.snap.Newest.Name; got != "sh.helm.release.v1.web.v2" {
		t.Errorf("A holds the lock on %s, want the newest record", got)
	}
	if got := a.Record().Revision; got != 0 {
		t.Errorf("A's take over a pending revision named revision %d, want none", got)
	}
	rb := req(OpUpgrade, 15*time.Second)
	rb.Session = "B"
	if b, _, err := w.b.TryAcquire(ctx, rb); err == nil {
		t.Errorf("two holders: A valid=%v, B valid=%v (B on %s)", a.Valid(), b.Valid(), b.snap.Object)
	}
}

// TestStaleHintIgnoredOnRecordLock: a record lock names the next revision
// only from its own read of the newest record, never from a hint (one left
// by an earlier take, when the newest record has since become a pending
// revision of someone else's).
func TestStaleHintIgnoredOnRecordLock(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	if _, err := w.cs.CoreV1().Secrets(ns).Create(ctx, recSecret(2, "pending-upgrade", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := req(OpUpgrade, 15*time.Second)
	r.nextRevision = 2
	h, _, err := w.b.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Record().Revision; got != 0 {
		t.Errorf("the take over pending revision 2 named revision %d, want none", got)
	}
}

// TestReadFloorIsTheTakesGate: a record lock's read floor is the
// resourceVersion of the gate its take wrote; a Lease and a virtual record
// lock (no record yet) have none.
func TestReadFloorIsTheTakesGate(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g, err := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.ReadFloor(); got == "" || got != g.ResourceVersion {
		t.Errorf("read floor %q, want the gate's resourceVersion %q", got, g.ResourceVersion)
	}

	empty := newRWorld(t)
	if err := empty.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	v, _, err := empty.b.TryAcquire(ctx, req(OpInstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := v.ReadFloor(); got != "" {
		t.Errorf("a virtual record lock has read floor %q, want none", got)
	}
	est := servertime.New(w.clk)
	est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
	l, _, err := fakeClocked(NewLeaseBackend(w.cs, est, w.clk)).TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.ReadFloor(); got != "" {
		t.Errorf("a Lease has read floor %q, want none", got)
	}
}

// TestJointTakenAtOnceWritesNoMore: a waiter whose parts are all free at
// their first attempt (its turn came) writes no more than a client that
// does not wait: no renewal of the record lock to confirm it, since no
// later part was waited for meanwhile (see Acquire).
func TestJointTakenAtOnceWritesNoMore(t *testing.T) {
	writes := func(wait bool) []string {
		w := newRWorld(t)
		est := servertime.New(w.clk)
		est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
		lb := fakeClocked(NewLeaseBackend(w.cs, est, w.clk))
		lb.Margin = time.Second
		j, err := Acquire(context.Background(), req(OpUpgrade, 15*time.Second), wait, nil, w.b, lb)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range j.parts {
			if h.waited {
				t.Errorf("wait %v: a free part counts as waited for", wait)
			}
		}
		var out []string
		for _, a := range w.cs.Actions() {
			switch a.GetVerb() {
			case "create", "update", "patch", "delete":
				out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
			}
		}
		return out
	}
	noWait, wait := writes(false), writes(true)
	if !slices.Equal(wait, noWait) {
		t.Errorf("taken at once while waiting, the joint lock wrote %v; without waiting %v", wait, noWait)
	}
}

// TestNewestAsTaken: a record lock tells what its take read of the newest
// record (its revision and status label, which its gate write was
// conditional on); a Lease tells nothing.
func TestNewestAsTaken(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	g, _ := w.cs.CoreV1().Secrets(ns).Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	g.Labels["status"] = "failed"
	if _, err := w.cs.CoreV1().Secrets(ns).Update(ctx, g, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if name, rev, st, ok := h.Newest(); !ok || name != "sh.helm.release.v1.web.v1" || rev != 1 || st != "failed" {
		t.Errorf("record lock: newest %s %d %q %v, want sh.helm.release.v1.web.v1, 1, failed", name, rev, st, ok)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A record without helm's status label (another tool's, or corrupt):
	// the lock tells nothing, so that the history is read in full.
	odd := recSecret(0, "deployed", nil)
	delete(odd.Labels, "status")
	if _, err := w.cs.CoreV1().Secrets(ns).Create(ctx, odd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h, _, err = w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if name, rev, st, ok := h.Newest(); ok {
		t.Errorf("with an unlabelled record: newest %s %d %q, want none told", name, rev, st)
	}
	est := servertime.New(w.clk)
	est.Observe(w.clk.Now(), w.clk.Now(), t0.Truncate(time.Second))
	lb := fakeClocked(NewLeaseBackend(w.cs, est, w.clk))
	hl, _, err := lb.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := hl.Newest(); ok {
		t.Error("a Lease told a newest record")
	}
}

// TestReadFindsTheBeatInTheList: once the beat carries the release's name
// label, one metadata list returns the records and the beat, and a take
// reads nothing else (a Secret of the user's labelled with the same name
// is ignored); a beat whose label was removed by hand is found by the
// create that conflicts with it, and read by name from then on.
func TestReadFindsTheBeatInTheList(t *testing.T) {
	for _, c := range []struct {
		name     string
		unlabel  bool
		wantGets int
	}{
		{"beat labelled", false, 1},
		{"beat unlabelled by hand", true, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRWorld(t)
			ctx := context.Background()
			w.takeAndRelease(t)
			bt := w.beat(t)
			if bt.Labels["name"] != "web" && !c.unlabel {
				t.Fatalf("the beat's labels %v carry no name", bt.Labels)
			}
			if c.unlabel {
				delete(bt.Labels, "name")
				if _, err := w.cs.CoreV1().Secrets(ns).Update(ctx, bt, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			mine := recSecret(9, "deployed", nil)
			mine.Name, mine.Labels = "users-own", map[string]string{"name": "web"}
			if _, err := w.cs.CoreV1().Secrets(ns).Create(ctx, mine, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			n := len(w.cs.Actions())
			h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			gets := 0
			for _, v := range w.verbsSince(n) {
				if v == "get" {
					gets++
				}
			}
			if gets != c.wantGets {
				t.Errorf("the take made %d gets %v, want %d (the gate's read for its write, and the beat's only when the list cannot show it)", gets, w.cs.Actions()[n:], c.wantGets)
			}
			if got := h.snap.Newest.Name; got != "sh.helm.release.v1.web.v1" {
				t.Errorf("the lock is on %q, want helm's newest record", got)
			}
		})
	}
}

// TestFirstInstallTakeReadsOnce: the lock of a release with no record is
// virtual (nothing is written); its take reads the release once (the Get:
// one list, which shows the beat when there is one), its Create
// reuses that read, and it names revision 1, the one an install writes, so
// that naming it costs nothing.
func TestFirstInstallTakeReadsOnce(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, "sh.helm.release.v1.web.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n := len(w.cs.Actions())
	h, _, err := w.b.TryAcquire(ctx, req(OpInstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	verbs := w.verbsSince(n)
	if !slices.Equal(verbs, []string{"list"}) {
		t.Errorf("the take made %v, want one read (the list)", verbs)
	}
	if got := h.Record().Revision; got != 1 {
		t.Errorf("the take named revision %d, want 1", got)
	}
	n = len(w.cs.Actions())
	if err := h.SetRevision(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := w.cs.Actions()[n:]; len(got) != 0 {
		t.Errorf("naming revision 1 made %v, want nothing", got)
	}
}
