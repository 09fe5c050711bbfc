package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

func TestDescribeAbandoned(t *testing.T) {
	by := Recoverer{Session: "s-new", At: t0.Add(3 * time.Second)}
	lock := expired(2, OpUpgrade)
	anon := LockInfo{State: LockExpired, LockedTill: t0}

	cases := []struct {
		name string
		a    Abandonment
		want string
	}{
		{
			name: "expired lock",
			a:    Abandonment{Release: rev(2, pUpgrade, t0), Lock: &lock},
			want: "Abandoned pending-upgrade by alice@ci-7 (session s-old, operation upgrade); lock expired at 2026-03-01T12:00:00Z; recovered by helm-autorecover session s-new at 2026-03-01T12:00:03Z",
		},
		{
			name: "record without holder details",
			a:    Abandonment{Release: rev(1, pInstall, t0), Lock: &anon},
			want: "Abandoned pending-install by an unknown holder; lock expired at 2026-03-01T12:00:00Z; recovered by helm-autorecover session s-new at 2026-03-01T12:00:03Z",
		},
		{
			name: "legacy",
			a:    Abandonment{Release: rev(2, pUpgrade, t0), PendingSince: t0.Add(-20 * time.Minute), Age: 20*time.Minute + 3500*time.Millisecond},
			want: "Abandoned pending-upgrade with no lock record (stock helm); pending since 2026-03-01T11:40:00Z, age 20m3s; recovered by helm-autorecover session s-new at 2026-03-01T12:00:03Z",
		},
		{
			name: "legacy uninstall",
			a:    Abandonment{Release: rev(4, uninstalng, t0), PendingSince: t0.Add(-time.Hour), Age: time.Hour},
			want: "Abandoned uninstalling with no lock record (stock helm); pending since 2026-03-01T11:00:00Z, age 1h0m0s; recovered by helm-autorecover session s-new at 2026-03-01T12:00:03Z",
		},
	}
	for _, c := range cases {
		if got := DescribeAbandoned(c.a, by); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// helmRelease is a release as helm itself stores it.
func helmRelease(name, ns string, version int, status common.Status) *rspb.Release {
	return &rspb.Release{
		Name: name, Namespace: ns, Version: version,
		Info: &rspb.Info{
			FirstDeployed: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
			LastDeployed:  time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC),
			Status:        status,
			Description:   "Preparing upgrade",
		},
		Chart:  &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: "nginx", Version: "1.0.0"}},
		Config: map[string]any{"replicas": 2},
		Labels: map[string]string{"team": "payments"},
	}
}

// storePending writes a revision with helm's own Secret driver, then adds an
// unknown JSON field and an annotation that MarkFailed must keep.
func storePending(t *testing.T, cs kubernetes.Interface, ns string, status common.Status) helmx.Summary {
	t.Helper()
	ctx := context.Background()
	rel := helmRelease("web", ns, 2, status)
	key := helmx.ReleaseSecretName("web", 2)
	if err := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Create(key, rel); err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := helmx.DecodeReleaseJSON(s.Data[helmx.ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	m["x_lock"] = map[string]any{"session": "s-old"}
	doc, _ = json.Marshal(m)
	if s.Data[helmx.ReleaseDataKey], err = helmx.EncodeReleaseJSON(doc); err != nil {
		t.Fatal(err)
	}
	s.Annotations = map[string]string{"example.com/keep": "yes"}
	if s, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sum, err := helmx.Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func TestMarkFailed(t *testing.T) {
	ctx := context.Background()
	cs := newFake()
	target := storePending(t, cs, "shop", pUpgrade)
	if target.ResourceVersion == "" {
		t.Fatal("fake clientset set no resourceVersion")
	}

	var sentRV string
	cs.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sentRV = a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).ResourceVersion
		return false, nil, nil
	})

	now := t0.Add(5 * time.Second)
	out, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "Abandoned pending-upgrade by test", now)
	if err != nil {
		t.Fatal(err)
	}
	if sentRV != target.ResourceVersion {
		t.Errorf("update carried resourceVersion %q, want the one read, %q", sentRV, target.ResourceVersion)
	}

	wantLabels := map[string]string{
		"name": "web", "owner": "helm", "status": "failed", "version": "2", "team": "payments",
		"modifiedAt": "1772366405",
	}
	for k, v := range wantLabels {
		if out.Meta.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, out.Meta.Labels[k], v)
		}
	}
	if out.Meta.Labels["createdAt"] == "" {
		t.Errorf("createdAt label lost")
	}
	if out.Meta.Annotations["example.com/keep"] != "yes" {
		t.Errorf("annotation lost: %v", out.Meta.Annotations)
	}
	if out.Secret().Type != helmx.ReleaseSecretType {
		t.Errorf("type = %q", out.Secret().Type)
	}

	doc, err := helmx.DecodeReleaseJSON(out.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), `"x_lock":{"session":"s-old"}`) {
		t.Errorf("unknown field lost: %s", doc)
	}

	// Stock helm reads the result.
	rel, err := driver.NewSecrets(cs.CoreV1().Secrets("shop")).Get(target.RecordName)
	if err != nil {
		t.Fatal(err)
	}
	r := rel.(*rspb.Release)
	if r.Info.Status != common.StatusFailed || r.Info.Description != "Abandoned pending-upgrade by test" {
		t.Errorf("helm reads status %q description %q", r.Info.Status, r.Info.Description)
	}
	if !r.Info.LastDeployed.Equal(time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)) {
		t.Errorf("last_deployed changed to %v", r.Info.LastDeployed)
	}

	// A second attempt finds it resolved.
	_, err = MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "again", now)
	if !errors.Is(err, ErrNotPending) {
		t.Fatalf("second MarkFailed: %v, want ErrNotPending", err)
	}
	want := `marking revision 2 of release "web" in namespace "shop" failed: it is failed now, so someone else resolved it; read the history again: the revision is no longer pending`
	if err.Error() != want {
		t.Errorf("error\n got %s\nwant %s", err, want)
	}
}

func TestMarkFailedUninstalling(t *testing.T) {
	cs := newFake()
	target := storePending(t, cs, "shop", uninstalng)
	out, err := MarkFailed(context.Background(), helmx.SecretRecords(cs), "shop", target, "d", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if out.Meta.Labels["status"] != "failed" {
		t.Errorf("status label %q", out.Meta.Labels["status"])
	}
	if _, ok := out.Meta.Labels["modifiedAt"]; ok {
		t.Errorf("modifiedAt set without a server time")
	}
}

func TestMarkFailedRefuses(t *testing.T) {
	ctx := context.Background()

	t.Run("not pending", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", deployed)
		if _, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0); !errors.Is(err, ErrNotPending) {
			t.Errorf("got %v, want ErrNotPending", err)
		}
	})

	t.Run("deleted", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		if err := cs.CoreV1().Secrets("shop").Delete(ctx, target.RecordName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0)
		if !errors.Is(err, ErrNotPending) {
			t.Errorf("got %v, want ErrNotPending", err)
		}
		if !strings.Contains(err.Error(), `its Secret "sh.helm.release.v1.web.v2" is gone`) {
			t.Errorf("error does not say the Secret is gone: %v", err)
		}
	})

	t.Run("changed since the decision", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		s, _ := cs.CoreV1().Secrets("shop").Get(ctx, target.RecordName, metav1.GetOptions{})
		s.Labels["touched"] = "yes"
		if _, err := cs.CoreV1().Secrets("shop").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		writes := countUpdates(cs)
		_, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0)
		if !errors.Is(err, ErrConflict) {
			t.Errorf("got %v, want ErrConflict", err)
		}
		if *writes != 0 {
			t.Errorf("%d writes after a stale read, want none", *writes)
		}
	})

	t.Run("only the lock annotation changed: still marked, at the new version", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		s, _ := cs.CoreV1().Secrets("shop").Get(ctx, target.RecordName, metav1.GetOptions{})
		s.Annotations["helm-autorecover.io/lock"] = `{"schema":1,"session":"renewed"}`
		s, err := cs.CoreV1().Secrets("shop").Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.ResourceVersion == target.ResourceVersion {
			t.Fatalf("the update left resourceVersion %s; the case needs a new one", s.ResourceVersion)
		}
		var sentRV string
		cs.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sentRV = a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).ResourceVersion
			return false, nil, nil
		})
		// The same holder's lock, renewed since the read.
		target.LockSession = "renewed"
		out, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0)
		if err != nil {
			t.Fatalf("MarkFailed after an annotation-only change: %v", err)
		}
		if sentRV != s.ResourceVersion {
			t.Errorf("update carried resourceVersion %q; want the one just read, %s", sentRV, s.ResourceVersion)
		}
		if out.Meta.Annotations["helm-autorecover.io/lock"] != `{"schema":1,"session":"renewed"}` {
			t.Errorf("the lock annotation was not kept: %v", out.Meta.Annotations)
		}
	})

	t.Run("the lock changed hands: refused", func(t *testing.T) {
		// The caller read the record under its own lock, then lost it (a
		// pause between its check and this write): another client took
		// the lock over, a lock write only, and the caller must not write
		// under the taker's lock (the simulation, seed 24550).
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		target.LockSession = "holder"
		s, _ := cs.CoreV1().Secrets("shop").Get(ctx, target.RecordName, metav1.GetOptions{})
		s.Annotations["helm-autorecover.io/lock"] = `{"schema":1,"session":"taker"}`
		if _, err := cs.CoreV1().Secrets("shop").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0); !errors.Is(err, ErrConflict) {
			t.Fatalf("MarkFailed after the lock changed hands: %v; want ErrConflict", err)
		}
		if got, _ := cs.CoreV1().Secrets("shop").Get(ctx, target.RecordName, metav1.GetOptions{}); got.Labels["status"] != string(pUpgrade) {
			t.Errorf("status label %q; want it left %s", got.Labels["status"], pUpgrade)
		}
	})

	t.Run("server reports a conflict", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		cs.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, target.RecordName, errors.New("the object has been modified"))
		})
		_, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0)
		if !errors.Is(err, ErrConflict) || !apierrors.IsConflict(err) {
			t.Errorf("got %v, want ErrConflict wrapping the API conflict", err)
		}
		if !strings.Contains(err.Error(), `release "web" in namespace "shop"`) || !strings.Contains(err.Error(), "decide again") {
			t.Errorf("error does not name the release or the next step: %v", err)
		}
	})

	t.Run("no resourceVersion: never a blind write", func(t *testing.T) {
		cs := newFake()
		target := storePending(t, cs, "shop", pUpgrade)
		s, _ := cs.CoreV1().Secrets("shop").Get(ctx, target.RecordName, metav1.GetOptions{})
		s.ResourceVersion = ""
		cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, s.DeepCopy(), nil
		})
		writes := countUpdates(cs)
		target.ResourceVersion = ""
		if _, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0); !errors.Is(err, ErrConflict) {
			t.Errorf("got %v, want ErrConflict", err)
		}
		if *writes != 0 {
			t.Errorf("%d writes without a resourceVersion, want none", *writes)
		}
	})

	t.Run("not a release", func(t *testing.T) {
		cs := newFake(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v2", Namespace: "shop", ResourceVersion: "3"}, Type: corev1.SecretTypeOpaque})
		_, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", rev(2, pUpgrade, t0), "d", t0)
		if err == nil || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotPending) {
			t.Errorf("got %v, want a plain error", err)
		}
	})
}

func countUpdates(cs *fake.Clientset) *int {
	n := new(int)
	cs.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		*n++
		return false, nil, nil
	})
	return n
}

// newFake is a fake clientset that keeps resourceVersions on Secrets and
// refuses an update whose resourceVersion is stale, as the API server does.
// It stands in for the server only in unit tests of MarkFailed's own logic;
// apply_integration_test.go proves the behaviour against a real one.
func newFake(objs ...runtime.Object) *fake.Clientset {
	cs := fake.NewClientset(objs...)
	gvr := corev1.SchemeGroupVersion.WithResource("secrets")
	next := 100
	bump := func(s *corev1.Secret) {
		next++
		s.ResourceVersion = strconv.Itoa(next)
	}
	cs.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		bump(a.(k8stesting.CreateAction).GetObject().(*corev1.Secret))
		return false, nil, nil
	})
	cs.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret)
		cur, err := cs.Tracker().Get(gvr, a.GetNamespace(), s.Name)
		if err != nil {
			return true, nil, err
		}
		if rv := s.ResourceVersion; rv != "" && rv != cur.(*corev1.Secret).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), s.Name, errors.New("the object has been modified"))
		}
		bump(s)
		return false, nil, nil
	})
	return cs
}

// TestDescriptionsTellTimeInOrder: a revision's description never names an
// expiry later than the recovery it reports, nor a decision an expiry
// later than the server time it was made at. A holder known to have
// stopped (its taker confirmed the expiry on its own clock) is recovered
// before its LOCKED TILL, which its Date headers may have put ahead: the
// description then says the holder stopped renewing, and names the LOCKED
// TILL as such (issue 31: "lock expired at 14:43:14Z; recovered by ... at
// 14:43:13Z").
func TestDescriptionsTellTimeInOrder(t *testing.T) {
	expiredAt := regexp.MustCompile(`expired at (\S+?)[;,]`)
	recoveredAt := regexp.MustCompile(`recovered by helm-autorecover session \S+ at (\S+)$`)
	parse := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return v
	}
	for off := -3 * time.Second; off <= 3*time.Second; off += 100 * time.Millisecond {
		l := expired(2, OpUpgrade) // LOCKED TILL t0
		l.LockedTill = t0.Add(400 * time.Millisecond)
		l.Stopped = true
		now := ServerTime{Earliest: l.LockedTill.Add(off - 150*time.Millisecond), Latest: l.LockedTill.Add(off)}
		d := Decide(Input{History: history(rev(1, deployed, t0.Add(-time.Hour)), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: l, Now: now, Policy: on})
		if d.Verdict != Recover {
			t.Fatalf("offset %s: %s (%s), want Recover", off, d.Verdict, d.Reason)
		}
		desc := DescribeAbandoned(d.Target, Recoverer{Session: "s-new", At: now.Latest})
		m := recoveredAt.FindStringSubmatch(desc)
		if m == nil {
			t.Fatalf("offset %s: description names no recovery time: %s", off, desc)
		}
		rec := parse(m[1])
		for what, text := range map[string]string{"description": desc, "decision": d.Reason, "decision done": d.Done} {
			if e := expiredAt.FindStringSubmatch(text); e != nil && parse(e[1]).After(rec) {
				t.Errorf("offset %s: the %s names an expiry at %s after the recovery at %s: %s", off, what, e[1], m[1], text)
			}
			if !strings.Contains(text, "2026-03-01T12:00:00Z") {
				t.Errorf("offset %s: the %s does not name the holder's LOCKED TILL: %s", off, what, text)
			}
		}
		if off < -400*time.Millisecond && !strings.Contains(desc, "stopped renewing its lock (LOCKED TILL 2026-03-01T12:00:00Z, not reached)") {
			t.Errorf("offset %s: description does not say the holder stopped before its LOCKED TILL: %s", off, desc)
		}
	}
}

// TestMarkFailedAsksTheLockLast: the writer's lock is asked right before
// the write leaves, after the read; a lock found lost then stops the
// write (the simulation, seed 82141: a holder that slept between its check
// and its write marked a revision failed after its lock expired).
func TestMarkFailedAsksTheLockLast(t *testing.T) {
	lost := fmt.Errorf("lock on release %q was not renewed before its renew deadline: %w", "web", lock.ErrLost)
	for _, tc := range []struct {
		name    string
		check   error
		written bool
	}{
		{"valid lock", nil, true},
		{"lost since the read", lost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newFake()
			target := storePending(t, cs, "shop", uninstalng)
			before := len(cs.Actions())
			asked := false
			ctx := WithBeforeWrite(context.Background(), func() error { asked = true; return tc.check })
			_, err := MarkFailed(ctx, helmx.SecretRecords(cs), "shop", target, "d", t0)
			if !asked {
				t.Fatal("the lock was not asked before the write")
			}
			updates := 0
			for _, a := range cs.Actions()[before:] {
				if a.GetVerb() == "update" {
					updates++
				}
			}
			if tc.written != (updates == 1) || tc.written != (err == nil) {
				t.Fatalf("MarkFailed = %v with %d updates; want written %v", err, updates, tc.written)
			}
			if !tc.written && !errors.Is(err, lock.ErrLost) {
				t.Fatalf("MarkFailed = %v, want the lock's loss", err)
			}
		})
	}
}
