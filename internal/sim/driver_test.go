package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
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

// cancelOn is helm's memory driver that notes every record update, and
// calls cancel during the first update of a record to status when.
type cancelOn struct {
	*driver.Memory
	when    common.Status
	cancel  func()
	updates []string
}

func (d *cancelOn) Update(key string, rls release.Releaser) error {
	r, ok := rls.(*rspb.Release)
	if !ok {
		return fmt.Errorf("a release of type %T", rls)
	}
	d.updates = append(d.updates, fmt.Sprintf("v%d %s", r.Version, r.Info.Status))
	if r.Info.Status == d.when && d.cancel != nil {
		d.cancel()
		d.cancel = nil
	}
	return d.Memory.Update(key, rls)
}

// TestHelmStopsWhenCancelled: the simulated helm's upgrade whose context
// ends (its lock lost, or its holder asked to stop: issue 34) marks its
// revision failed, writes nothing else, and returns the context's error,
// as helm 4's does: cancelled while it marks the previous revision
// superseded, it does not write its own deployed; cancelled during its
// hook, it applies nothing of the chart.
func TestHelmStopsWhenCancelled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hook    time.Duration
		when    common.Status // the update cancelled during, or
		after   time.Duration // the time it is cancelled at
		updates string
		objects string
	}{
		{"while marking the previous revision superseded", 0, common.StatusSuperseded, 0, "v1 superseded,v2 failed", ""},
		{"during its hook", 5 * time.Second, "", 2 * time.Second, "v2 failed", "app-hook"},
		{"not at all", 5 * time.Second, "", 0, "v1 superseded,v2 deployed", "app,app-hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				d := &cancelOn{Memory: driver.NewMemory(), when: tc.when}
				if tc.when != "" {
					d.cancel = cancel
				}
				if tc.after > 0 {
					time.AfterFunc(tc.after, cancel)
				}
				d.SetNamespace(Namespace)
				if err := d.Create("sh.helm.release.v1.app.v1", newRelease(1, common.StatusDeployed, time.Now())); err != nil {
					t.Fatal(err)
				}
				cfg := &action.Configuration{Releases: storage.Init(d)}
				cs := fake.NewClientset()
				p := Plan{ID: "a", Op: autorecover.OpUpgrade, Work: 3 * time.Second, Hook: tc.hook}
				err := helm(ctx, cfg, cs.CoreV1().ConfigMaps(Namespace), p, NewClock(0), func(string, ...any) {})
				switch {
				case tc.when == "" && tc.after == 0 && err != nil:
					t.Fatalf("helm: %v", err)
				case (tc.when != "" || tc.after > 0) && !errors.Is(err, context.Canceled):
					t.Fatalf("helm returned %v, want the context's error", err)
				}
				if got := strings.Join(d.updates, ","); got != tc.updates {
					t.Fatalf("record updates %q, want %q", got, tc.updates)
				}
				cms, err := cs.CoreV1().ConfigMaps(Namespace).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, cm := range cms.Items {
					names = append(names, cm.Name)
				}
				sort.Strings(names)
				if got := strings.Join(names, ","); got != tc.objects {
					t.Fatalf("chart objects %q, want %q", got, tc.objects)
				}
			})
		})
	}
}
