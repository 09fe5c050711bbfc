package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/release/common"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the current output")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// The API server's clock in every fake: the estimator saw one response
// dated t0, so server time is known to lie in [t0, t0+1s].
var t0 = time.Date(2026, 12, 2, 13, 10, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// fakeEnv is a lockCmds on a fake clientset with a fixed server clock.
type fakeEnv struct {
	c           *lockCmds
	client      *fake.Clientset
	out, errOut *bytes.Buffer
	in          *strings.Reader
	tty         bool
	autoStep    atomic.Bool
	waiting     atomic.Bool
}

// waitWatcher passes writes on and notes when recovery says it waits.
type waitWatcher struct {
	w       io.Writer
	waiting *atomic.Bool
}

func (w waitWatcher) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("waiting for it")) {
		w.waiting.Store(true)
	}
	return w.w.Write(p)
}

func newFakeEnv(t *testing.T, objs ...runtime.Object) *fakeEnv {
	t.Helper()
	client := fake.NewClientset(objs...)
	// --lock-backend=auto asks for the rights on Leases: granted, unless a
	// test denies them (denyLeases).
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	clk := clocktesting.NewFakeClock(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) // local clock: any
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0)
	// Recovery after a forced unlock waits, on this clock, until the
	// holder's LOCKED TILL has passed: with autoStep, time moves on whenever
	// something waits on it (renewals too, so such a test cannot pin its
	// writes or times).
	e := &fakeEnv{client: client, out: &bytes.Buffer{}, errOut: &bytes.Buffer{}, in: strings.NewReader("")}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			// Only once recovery says it waits (its timer is armed right
			// after), in steps well inside the recovering lock's own lease.
			if e.autoStep.Load() && e.waiting.Load() && clk.HasWaiters() {
				clk.Step(100 * time.Millisecond)
			}
		}
	}()
	settings := helmcli.New()
	settings.SetNamespace("prod")
	n := 0
	e.c = &lockCmds{
		settings:   settings,
		out:        e.out,
		errOut:     waitWatcher{w: e.errOut, waiting: &e.waiting},
		in:         e.in,
		isTerminal: func() bool { return e.tty },
		connect: func() (*protocol.Conn, error) {
			// Converge runs on a fake dynamic client: the fixtures' manifests
			// are empty, so it finds nothing to undo.
			kube := func() (*recovery.Kube, error) {
				return &recovery.Kube{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Mapper: meta.NewDefaultRESTMapper(nil)}, nil
			}
			pc := protocol.NewConn(client, est, clk, "", kube)
			// The fixtures' server clock stands still: their locks are
			// judged by it alone (lock.Confirm is tested in internal/lock
			// and against the local cluster).
			pc.JudgeByServerTimeOnly()
			return pc, nil
		},
		who: func() string { return "bob@laptop" },
		newSession: func() string {
			n++
			return "9e8d0000-7777-4a5b-9c8d-00000000000" + strconv.Itoa(n)
		},
	}
	return e
}

// run executes one of the lock commands with args and returns its exit
// code as cli.Run would compute it.
func (e *fakeEnv) run(t *testing.T, cmd *cobra.Command, args ...string) (int, error) {
	t.Helper()
	e.out.Reset()
	e.errOut.Reset()
	if args == nil {
		args = []string{} // nil makes cobra read os.Args
	}
	cmd.SetArgs(args)
	cmd.SetOut(e.out)
	cmd.SetErr(e.errOut)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.Execute()
	if err == nil {
		return 0, nil
	}
	var exit *exitcode.Error
	if errors.As(err, &exit) {
		return exit.Code, err
	}
	return 1, err
}

// writes lists the verbs other than get, list and watch the fake saw.
func (e *fakeEnv) writes() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch {
		case a.GetVerb() == "get", a.GetVerb() == "list", a.GetVerb() == "watch":
			continue
		case a.GetResource().Resource == "selfsubjectaccessreviews":
			continue // a question, not a write
		}
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
	}
	return out
}

// Fixture builders.

const (
	sessWeb = "0f3c6a2e-1111-4a5b-9c8d-000000000001"
	sessAPI = "7a9b0000-3333-4a5b-9c8d-000000000003"
	sessDB  = "c4d50000-4444-4a5b-9c8d-000000000004"
)

func revision(t *testing.T, rel, ns string, rev int, status common.Status, created time.Time) *corev1.Secret {
	t.Helper()
	doc, err := json.Marshal(map[string]any{
		"name": rel, "namespace": ns, "version": rev,
		"info": map[string]any{
			"status": status, "description": "fixture", "first_deployed": t0.Add(-2 * time.Hour).Format(time.RFC3339), "last_deployed": created.Format(time.RFC3339),
		},
		"chart": map[string]any{"metadata": map[string]any{"name": "app", "version": "0.1.0", "appVersion": "1.0"}},
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
			Name: helmx.ReleaseSecretName(rel, rev), Namespace: ns, ResourceVersion: "10",
			CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{
				helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelName: rel, helmx.LabelVersion: strconv.Itoa(rev),
				helmx.LabelStatus: string(status),
			},
		},
		Type: helmx.ReleaseSecretType,
		Data: map[string][]byte{helmx.ReleaseDataKey: payload},
	}
}

// carrying is the record sec carrying lock rec, as a holder's fenced create
// writes it (both stores then hold the same lock).
func carrying(t *testing.T, sec *corev1.Secret, rec *lock.Record) *corev1.Secret {
	t.Helper()
	s, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	sec.Annotations = map[string]string{lock.AnnotationRecord: s}
	return sec
}

func record(rel, ns, session string, op lock.Operation, rev int, acquired, renewed time.Time) *lock.Record {
	return &lock.Record{
		Schema: lock.SchemaVersion, Session: session, Operation: op, Release: rel, Namespace: ns, Revision: rev,
		Who: "alice@ci-7", PID: 4242, ToolVersion: "v0.1.0",
		Timeout:       metav1.Duration{Duration: 5 * time.Minute},
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
		AcquiredAt:    acquired, RenewedAt: renewed, LockedTill: renewed.Add(15 * time.Second),
	}
}

// lease is the Lease lock.Backend writes for rec (held unless the
// record is released).
func lease(t *testing.T, rec *lock.Record) *coordinationv1.Lease {
	t.Helper()
	s, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	holder := rec.Session
	if !rec.ReleasedAt.IsZero() {
		holder = ""
	}
	secs := int32(rec.LeaseDuration.Seconds())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: lock.LeaseName(rec.Release), Namespace: rec.Namespace, ResourceVersion: "20",
			Labels:      map[string]string{lock.LabelManagedBy: lock.ManagedBy, lock.LabelRelease: rec.Release},
			Annotations: map[string]string{lock.AnnotationRecord: s},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &secs,
			AcquireTime:          &metav1.MicroTime{Time: rec.AcquiredAt},
			RenewTime:            &metav1.MicroTime{Time: rec.RenewedAt},
		},
	}
}

// fixture is a namespace "prod" with:
//   - web: revision 8 pending-upgrade under a live lock (renewed 5 s ago);
//   - api: revision 3 pending-upgrade under a lock that expired 8m45s ago;
//   - legacy: revision 2 pending-rollback for 4 minutes, no lock (stock helm);
//   - db: deployed, its lock released.
func fixture(t *testing.T) []runtime.Object {
	t.Helper()
	live := record("web", "prod", sessWeb, lock.OpUpgrade, 8, at(-40*time.Second), at(-5*time.Second))
	live.CIJobURL = "https://github.com/acme/web/actions/runs/42"
	dead := record("api", "prod", sessAPI, lock.OpUpgrade, 3, at(-10*time.Minute), at(-9*time.Minute))
	released := record("db", "prod", sessDB, lock.OpInstall, 1, at(-time.Hour), at(-time.Hour))
	released.ReleasedAt = at(-59 * time.Minute)
	return []runtime.Object{
		revision(t, "web", "prod", 7, common.StatusDeployed, at(-time.Hour)),
		carrying(t, revision(t, "web", "prod", 8, common.StatusPendingUpgrade, at(-30*time.Second)), live),
		lease(t, live),
		revision(t, "api", "prod", 2, common.StatusDeployed, at(-time.Hour)),
		carrying(t, revision(t, "api", "prod", 3, common.StatusPendingUpgrade, at(-9*time.Minute-30*time.Second)), dead),
		lease(t, dead),
		revision(t, "legacy", "prod", 1, common.StatusDeployed, at(-time.Hour)),
		revision(t, "legacy", "prod", 2, common.StatusPendingRollback, at(-4*time.Minute)),
		revision(t, "db", "prod", 1, common.StatusDeployed, at(-time.Hour)),
		lease(t, released),
	}
}

// denyLeases makes the fake API server refuse every request on Leases, as
// it does a user bound to the release backend's Role (docs/rbac.md), and
// deny them in access reviews.
func (e *fakeEnv) denyLeases() {
	e.client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", fmt.Errorf("User \"system:serviceaccount:prod:ci\" cannot %s resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"%s\"", a.GetVerb(), a.GetNamespace()))
	})
	e.client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject(), nil
	})
}
