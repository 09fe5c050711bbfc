package protocol

import (
	"context"
	"testing"

	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestIntegrationNewestOrderAgrees: the lock store picked the newest record by
// helm's "version" label (first maximum in the list's name order); the
// fence by the revision in the record's name. A copy of revision 1 kept
// under another name with helm's labels (a hand-made backup) sorts first by
// name, so the lock is taken on the copy, while the fence judges the real
// revision 1, which carries no lock: since c4b05f9 helm's create of
// revision 2 was refused as "stock helm dropped our lock" (exit 4), for
// every guarded upgrade of this release (found by review). Both now order
// records with records.Compare.
func TestIntegrationNewestOrderAgrees(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	settleInstall(t, env, ns)
	ctx := context.Background()
	secrets := env.Client.CoreV1().Secrets(ns)
	v1, err := secrets.Get(ctx, helmx.ReleaseSecretName("web", 1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp := v1.DeepCopy()
	cp.ObjectMeta = metav1.ObjectMeta{Name: "backup-web-v1", Labels: v1.Labels}
	if _, err := secrets.Create(ctx, cp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := settleConn(t, env.Config)
	l := settleAcquire(t, c, ns)
	defer func() { _ = l.Release(ctx) }()
	if err := l.SetRevision(ctx, 2); err != nil {
		t.Fatal(err)
	}
	w := &helmx.WriteFence{}
	defer w.Guard(helmx.GuardedWrites{Namespace: ns, Release: "web", Resource: "secrets", Lock: l})()
	cs, err := kubernetes.NewForConfig(w.Wrap(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(cs.CoreV1().Secrets(ns))
	if err := d.Create(helmx.ReleaseSecretName("web", 2), settleRelease(ns, 2, common.StatusPendingUpgrade)); err != nil {
		t.Errorf("helm's create of revision 2 under our live lock refused: %v", err)
	}
}
