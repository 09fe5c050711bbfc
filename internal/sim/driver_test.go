package sim

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSecretsAsHelm: the simulation's two record writes store the very
// Secret helm's own driver stores, labels and bytes alike, and a record it
// wrote reads back through helm's driver.
func TestSecretsAsHelm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		helmCS, simCS := fake.NewClientset(), fake.NewClientset()
		helmD := driver.NewSecrets(helmCS.CoreV1().Secrets(Namespace))
		simD := &secrets{Secrets: driver.NewSecrets(simCS.CoreV1().Secrets(Namespace)), impl: simCS.CoreV1().Secrets(Namespace)}
		same := func(step string) {
			t.Helper()
			want, err := helmCS.CoreV1().Secrets(Namespace).Get(ctx, "sh.helm.release.v1.app.v3", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := simCS.CoreV1().Secrets(Namespace).Get(ctx, "sh.helm.release.v1.app.v3", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("%s: the simulation stored\n%+v\nhelm stores\n%+v", step, got, want)
			}
		}
		rel := newRelease(3, common.StatusPendingUpgrade, time.Now())
		rel.Labels = map[string]string{"team": "a"}
		for _, d := range []driver.Driver{helmD, simD} {
			if err := d.Create("sh.helm.release.v1.app.v3", rel); err != nil {
				t.Fatal(err)
			}
		}
		same("create")
		if err := simD.Create("sh.helm.release.v1.app.v3", rel); !errors.Is(err, driver.ErrReleaseExists) {
			t.Fatalf("a second create: err = %v, want helm's %v", err, driver.ErrReleaseExists)
		}
		time.Sleep(90 * time.Second)
		// As read back through helm's driver: its labels carry the
		// create's stamp, and a modifiedAt of an earlier update.
		rel.Labels = map[string]string{"team": "a", "createdAt": "946684800", "modifiedAt": "946684801"}
		rel.Info.Status = common.StatusDeployed
		for _, d := range []driver.Driver{helmD, simD} {
			if err := d.Update("sh.helm.release.v1.app.v3", rel); err != nil {
				t.Fatal(err)
			}
		}
		same("update")
		back, err := simD.Get("sh.helm.release.v1.app.v3")
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := back.(*rspb.Release); !ok || r.Info.Status != common.StatusDeployed || r.Version != 3 {
			t.Fatalf("read back through helm's driver: %+v", back)
		}
	})
}
