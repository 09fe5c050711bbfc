package helmx

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// casSecrets is an in-memory Secret store behind a fake clientset that, unlike
// the stock fake, assigns resourceVersions and uids, rejects stale updates and
// deletes with Conflict, and accepts updates without a resourceVersion
// unconditionally, as the API server does for Secrets. It exercises the
// conflict paths in unit tests; the integration tests in pkg/autorecover are
// the proof against a real API server.
type casSecrets struct {
	mu     sync.Mutex
	rv     int
	objs   map[string]*corev1.Secret
	writes map[string]int
}

var secretsGR = corev1.Resource("secrets")

func newCASSecrets() (*fake.Clientset, *casSecrets) {
	s := &casSecrets{objs: map[string]*corev1.Secret{}, writes: map[string]int{}}
	c := fake.NewClientset()
	c.PrependReactor("*", "secrets", s.react)
	return c, s
}

func (s *casSecrets) get(name string) *corev1.Secret {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.objs[name]; o != nil {
		return o.DeepCopy()
	}
	return nil
}

func (s *casSecrets) writeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.writes {
		n += c
	}
	return n
}

func (s *casSecrets) next() string {
	s.rv++
	return strconv.Itoa(s.rv)
}

func (s *casSecrets) react(a k8stesting.Action) (bool, runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch a.GetVerb() {
	case "get":
		a := a.(k8stesting.GetAction)
		o := s.objs[a.GetName()]
		if o == nil {
			return true, nil, apierrors.NewNotFound(secretsGR, a.GetName())
		}
		return true, o.DeepCopy(), nil
	case "list":
		a := a.(k8stesting.ListAction)
		sel := a.GetListRestrictions().Labels
		out := &corev1.SecretList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(s.rv)}}
		for _, o := range s.objs {
			if sel == nil || sel.Matches(labels.Set(o.Labels)) {
				out.Items = append(out.Items, *o.DeepCopy())
			}
		}
		return true, out, nil
	case "create":
		a := a.(k8stesting.CreateAction)
		s.writes["create"]++
		o := a.GetObject().(*corev1.Secret).DeepCopy()
		if s.objs[o.Name] != nil {
			return true, nil, apierrors.NewAlreadyExists(secretsGR, o.Name)
		}
		o.ResourceVersion = s.next()
		o.UID = types.UID("uid-" + o.Name + "-" + o.ResourceVersion)
		o.CreationTimestamp = metav1.Now()
		s.objs[o.Name] = o
		return true, o.DeepCopy(), nil
	case "update":
		a := a.(k8stesting.UpdateAction)
		s.writes["update"]++
		o := a.GetObject().(*corev1.Secret).DeepCopy()
		cur := s.objs[o.Name]
		if cur == nil {
			return true, nil, apierrors.NewNotFound(secretsGR, o.Name)
		}
		if o.ResourceVersion != "" && o.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(secretsGR, o.Name, fmt.Errorf("resourceVersion %s is stale, object is at %s", o.ResourceVersion, cur.ResourceVersion))
		}
		o.UID, o.CreationTimestamp = cur.UID, cur.CreationTimestamp
		o.ResourceVersion = s.next()
		s.objs[o.Name] = o
		return true, o.DeepCopy(), nil
	case "delete":
		a := a.(k8stesting.DeleteAction)
		s.writes["delete"]++
		cur := s.objs[a.GetName()]
		if cur == nil {
			return true, nil, apierrors.NewNotFound(secretsGR, a.GetName())
		}
		if p := a.GetDeleteOptions().Preconditions; p != nil {
			if (p.ResourceVersion != nil && *p.ResourceVersion != cur.ResourceVersion) || (p.UID != nil && *p.UID != cur.UID) {
				return true, nil, apierrors.NewConflict(secretsGR, a.GetName(), errors.New("precondition failed"))
			}
		}
		delete(s.objs, a.GetName())
		return true, nil, nil
	}
	return false, nil, nil
}

// switchFence is a Fence the test turns off.
type switchFence struct {
	mu  sync.Mutex
	err error
}

func (f *switchFence) Valid() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *switchFence) lose(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

var fixedNow = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

func newFenced(t *testing.T, cs *fake.Clientset, ns string, fence Fence) *FencedSecrets {
	t.Helper()
	d, err := NewFencedSecrets(cs.CoreV1().Secrets(ns), fence, FencedOptions{Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFencedWritesWhatHelmReads(t *testing.T) {
	cs, store := newCASSecrets()
	rel := sampleRelease()
	// A listed release carries system labels; they must be set afresh.
	rel.Labels = map[string]string{"team": "shop", LabelStatus: "bogus", LabelCreatedAt: "1"}
	key := ReleaseSecretName(rel.Name, rel.Version)
	d := newFenced(t, cs, rel.Namespace, &switchFence{})

	if err := d.Create(key, rel); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Create(key, rel); !errors.Is(err, driver.ErrReleaseExists) {
		t.Fatalf("second Create: got %v, want driver.ErrReleaseExists", err)
	}
	s := store.get(key)
	wantLabels := map[string]string{
		"team": "shop", LabelName: "web", LabelOwner: OwnerHelm, LabelStatus: "pending-upgrade",
		LabelVersion: "4", LabelCreatedAt: strconv.FormatInt(fixedNow.Unix(), 10),
	}
	if !reflect.DeepEqual(s.Labels, wantLabels) {
		t.Errorf("labels after Create = %v, want %v", s.Labels, wantLabels)
	}
	if s.Type != ReleaseSecretType {
		t.Errorf("type = %q, want %q", s.Type, ReleaseSecretType)
	}

	stock := driver.NewSecrets(cs.CoreV1().Secrets(rel.Namespace))
	got, err := stock.Get(key)
	if err != nil {
		t.Fatalf("helm's own driver cannot read the record: %v", err)
	}
	g := got.(*rspb.Release)
	if g.Name != rel.Name || g.Version != rel.Version || g.Info.Status != rel.Info.Status ||
		g.Manifest != rel.Manifest || !reflect.DeepEqual(g.Config, map[string]any{"replicas": float64(3)}) ||
		!g.Info.LastDeployed.Equal(rel.Info.LastDeployed) || g.Chart.Metadata.Version != "1.2.3" {
		t.Errorf("helm read back %+v / %+v", g, g.Info)
	}

	// Someone annotates the record; an Update through the driver keeps the
	// annotation and createdAt, which helm's own Update drops.
	ann := store.get(key)
	ann.Annotations = map[string]string{"example.com/note": "keep me"}
	if _, err := cs.CoreV1().Secrets(rel.Namespace).Update(context.Background(), ann, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(key); err != nil {
		t.Fatal(err)
	}
	rel.Info.Status = common.StatusDeployed
	if err := d.Update(key, rel); err != nil {
		t.Fatalf("Update: %v", err)
	}
	s = store.get(key)
	wantLabels[LabelStatus] = "deployed"
	wantLabels[LabelModifiedAt] = strconv.FormatInt(fixedNow.Unix(), 10)
	if !reflect.DeepEqual(s.Labels, wantLabels) {
		t.Errorf("labels after Update = %v, want %v", s.Labels, wantLabels)
	}
	if s.Annotations["example.com/note"] != "keep me" {
		t.Errorf("annotations after Update = %v; the annotation was dropped", s.Annotations)
	}
	if got, _ := stock.Get(key); got.(*rspb.Release).Info.Status != common.StatusDeployed {
		t.Errorf("helm reads status %q after Update, want deployed", got.(*rspb.Release).Info.Status)
	}
}

func TestFencedUpdateIsConditional(t *testing.T) {
	ns := "shop"
	rel := sampleRelease()
	key := ReleaseSecretName(rel.Name, rel.Version)

	t.Run("a blind write between read and update makes it conflict", func(t *testing.T) {
		cs, store := newCASSecrets()
		d := newFenced(t, cs, ns, &switchFence{})
		if err := d.Create(key, rel); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Get(key); err != nil {
			t.Fatal(err)
		}
		other := sampleRelease()
		other.Info.Status = common.StatusFailed
		other.Info.Description = "written by someone else"
		if err := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Update(key, other); err != nil {
			t.Fatal(err)
		}
		mine := sampleRelease()
		mine.Info.Status = common.StatusDeployed
		for i := range 2 {
			err := d.Update(key, mine)
			if !errors.Is(err, ErrConflict) || !apierrors.IsConflict(err) {
				t.Fatalf("Update %d: got %v, want ErrConflict from the server's 409", i, err)
			}
		}
		got, _ := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Get(key)
		if g := got.(*rspb.Release).Info; g.Status != common.StatusFailed || g.Description != "written by someone else" {
			t.Fatalf("the other writer's record was overwritten: %+v", g)
		}
		if s := store.get(key); s.Labels[LabelStatus] != "failed" {
			t.Fatalf("status label = %q, want the other writer's failed", s.Labels[LabelStatus])
		}
		// Read again, decide again: now the write goes through.
		if _, err := d.Get(key); err != nil {
			t.Fatal(err)
		}
		if err := d.Update(key, mine); err != nil {
			t.Fatalf("Update after a fresh read: %v", err)
		}
	})

	t.Run("an unread record is never overwritten", func(t *testing.T) {
		cs, store := newCASSecrets()
		if err := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Create(key, rel); err != nil {
			t.Fatal(err)
		}
		d := newFenced(t, cs, ns, &switchFence{})
		before := store.writeCount()
		if err := d.Update(key, rel); !errors.Is(err, ErrNotObserved) {
			t.Fatalf("Update of an unread record: got %v, want ErrNotObserved", err)
		}
		if store.writeCount() != before {
			t.Fatal("Update of an unread record sent a write")
		}
	})

	t.Run("query and list responses count as reads", func(t *testing.T) {
		cs, _ := newCASSecrets()
		if err := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Create(key, rel); err != nil {
			t.Fatal(err)
		}
		for name, read := range map[string]func(d *FencedSecrets) error{
			"query": func(d *FencedSecrets) error {
				_, err := d.Query(map[string]string{LabelName: rel.Name, LabelOwner: OwnerHelm})
				return err
			},
			"list": func(d *FencedSecrets) error {
				_, err := d.List(func(release.Releaser) bool { return true })
				return err
			},
		} {
			d := newFenced(t, cs, ns, &switchFence{})
			if err := read(d); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := d.Update(key, rel); err != nil {
				t.Fatalf("Update after %s: %v", name, err)
			}
		}
	})

	t.Run("through helm's storage layer", func(t *testing.T) {
		cs, _ := newCASSecrets()
		d := newFenced(t, cs, ns, &switchFence{})
		st := storage.Init(d)
		if err := st.Create(rel); err != nil {
			t.Fatal(err)
		}
		last, err := st.Last(rel.Name)
		if err != nil {
			t.Fatal(err)
		}
		l := last.(*rspb.Release)
		l.Info.Status = common.StatusDeployed
		if err := st.Update(l); err != nil {
			t.Fatalf("storage Update after Last: %v", err)
		}
	})
}

func TestFencedRefusesWhenLockLost(t *testing.T) {
	ns := "shop"
	rel := sampleRelease()
	key := ReleaseSecretName(rel.Name, rel.Version)
	for name, lostErr := range map[string]error{
		"lock error":  fmt.Errorf("lock on release %q was not renewed: %w", rel.Name, lock.ErrLost),
		"other error": errors.New("fence says no"),
	} {
		t.Run(name, func(t *testing.T) {
			cs, store := newCASSecrets()
			fence := &switchFence{}
			d := newFenced(t, cs, ns, fence)
			if err := d.Create(key, rel); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Get(key); err != nil {
				t.Fatal(err)
			}
			fence.lose(lostErr)
			before := store.writeCount()
			next := sampleRelease()
			next.Version = 5
			writes := map[string]func() error{
				"create": func() error { return d.Create(ReleaseSecretName(rel.Name, 5), next) },
				"update": func() error { return d.Update(key, rel) },
				"delete": func() error { _, err := d.Delete(key); return err },
			}
			for op, write := range writes {
				err := write()
				if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lostErr) {
					t.Errorf("%s after the lock was lost: got %v, want an error wrapping lock.ErrLost and the fence's error", op, err)
				}
			}
			if n := store.writeCount() - before; n != 0 {
				t.Errorf("%d writes reached the API server after the lock was lost", n)
			}
			// Reads stay allowed: the caller may still look.
			if _, err := d.Get(key); err != nil {
				t.Errorf("Get after the lock was lost: %v", err)
			}
		})
	}
}

func TestFencedDeleteIsConditional(t *testing.T) {
	ns := "shop"
	rel := sampleRelease()
	key := ReleaseSecretName(rel.Name, rel.Version)
	cs, store := newCASSecrets()
	d := newFenced(t, cs, ns, &switchFence{})
	if err := d.Create(key, rel); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(key); err != nil {
		t.Fatal(err)
	}
	other := sampleRelease()
	other.Info.Description = "changed by someone else"
	if err := driver.NewSecrets(cs.CoreV1().Secrets(ns)).Update(key, other); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Delete(key); !errors.Is(err, ErrConflict) {
		t.Fatalf("Delete of a record changed since it was read: got %v, want ErrConflict", err)
	}
	if store.get(key) == nil {
		t.Fatal("the changed record was deleted")
	}
	if _, err := d.Get(key); err != nil {
		t.Fatal(err)
	}
	got, err := d.Delete(key)
	if err != nil {
		t.Fatalf("Delete after a fresh read: %v", err)
	}
	if got.(*rspb.Release).Info.Description != "changed by someone else" {
		t.Errorf("Delete returned %+v, want the deleted release", got.(*rspb.Release).Info)
	}
	if store.get(key) != nil {
		t.Fatal("record still there after Delete")
	}
	if _, err := d.Delete(key); !errors.Is(err, driver.ErrReleaseNotFound) {
		t.Fatalf("Delete of a missing record: got %v, want driver.ErrReleaseNotFound", err)
	}
}

func TestNewFencedSecretsNeedsAFence(t *testing.T) {
	cs := fake.NewClientset()
	if _, err := NewFencedSecrets(cs.CoreV1().Secrets("x"), nil, FencedOptions{}); err == nil {
		t.Fatal("NewFencedSecrets accepted a nil fence")
	}
	if _, err := NewFencedSecrets(nil, &switchFence{}, FencedOptions{}); err == nil {
		t.Fatal("NewFencedSecrets accepted a nil Secrets client")
	}
}
