package protocol

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestEndDrainsBeforeDeciding: a first install whose create of revision 1
// is answered 504 while the API server commits it a moment later (its
// timeout filter answers while the handler goes on). End drains the fence
// before the door decides whether to delete the lock (the guard deletes it
// when the release still has no revision), so the decision reads the
// revision that landed; and a lock lost meanwhile (the drain waited out
// the write's deadline, which is the lock's) writes nothing. Found by the
// review of issue 32's steps: deciding first deleted the lock and stripped
// it from the landed revision, which the next client then took for stock
// helm's and refused for the legacy age.
func TestEndDrainsBeforeDeciding(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	c := settleConn(t, env.Config)
	l, err := c.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpInstall, LeaseDuration: 15 * time.Second, Backend: BackendRelease})
	if err != nil {
		t.Fatal(err)
	}
	rec1 := helmx.ReleaseSecretName("web", 1)
	landed := make(chan struct{})
	helmCfg := env.Proxy(t, func(w http.ResponseWriter, r *http.Request, forward http.Handler) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/secrets") {
			forward.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(rec1)) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			forward.ServeHTTP(w, r)
			return
		}
		later := r.Clone(context.Background())
		go func() {
			defer close(landed)
			time.Sleep(2 * time.Second)
			later.Body = io.NopCloser(bytes.NewReader(body))
			later.ContentLength = int64(len(body))
			rec := httptest.NewRecorder()
			forward.ServeHTTP(rec, later)
			t.Logf("the create landed late: %d", rec.Code)
		}()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGatewayTimeout)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Timeout: request did not complete within the allowed duration","reason":"Timeout","code":504}`)
	})
	cs, err := kubernetes.NewForConfig(l.Fence().Wrap(helmCfg))
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	// helm renders and applies for a while; the last renewal (none:
	// Keep is not running, as when the create follows a renewal by
	// more than 4 s of a 15 s lease) leaves less than End's 10 s.
	time.Sleep(6 * time.Second)
	if err := d.Create(rec1, settleRelease(ns, 1, common.StatusPendingInstall)); err == nil {
		t.Fatal("helm's create succeeded; want it answered 504")
	}
	// The guard's Releasing: the release had no revision at the take.
	g := Guarded{
		Releasing: func(ctx context.Context, err error) bool {
			hist, herr := c.History(ctx, ns, "web")
			return err != nil && herr == nil && len(hist) == 0
		},
		Released: func(err error) { t.Logf("released: %v", err) },
	}
	l.End(ctx, g, errors.New("helm's install failed"))
	<-landed
	sec, err := env.Client.CoreV1().Secrets(ns).Get(ctx, rec1, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("revision 1: status %s, lock annotation present %v", sec.Labels["status"], sec.Annotations[lock.AnnotationRecord] != "")
	// The next client, waiting for the lock to expire.
	c2 := settleConn(t, env.Config)
	l2, err := c2.Take(ctx, Request{Release: "web", Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: 15 * time.Second, Backend: BackendRelease, Wait: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l2.Release(ctx) }()
	out, err := l2.Recover(ctx, Procedure{Policy: settlePolicy, Next: lock.OpUpgrade})
	if err != nil {
		t.Fatal(err)
	}
	if out.Decision.Verdict == recovery.Blocked {
		t.Fatalf("the next client is blocked (exit 5) once the lock expired: %s", out.Decision.Reason)
	}
	t.Logf("next client: %v", out.Decision.Verdict)
}
