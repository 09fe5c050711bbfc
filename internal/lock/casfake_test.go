package lock

import (
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// casLeases is a small in-memory Lease store behind a fake clientset that,
// unlike the stock fake, assigns resourceVersions, rejects stale updates and
// deletes with Conflict, and feeds watches. It exists to exercise the
// conflict paths in unit tests; the real proof is the integration tests.
type casLeases struct {
	mu       sync.Mutex
	rv       int
	objs     map[string]*coordinationv1.Lease // namespace/name
	watchers []*casWatch
	// fail, when set, may return an error for a verb before it is applied.
	fail func(verb string) error
	// calls counts requests by verb.
	calls map[string]int
}

type casWatch struct {
	ns, name string
	w        *watch.RaceFreeFakeWatcher
}

var leaseGR = coordinationv1.Resource("leases")

func newCASClient() (*fake.Clientset, *casLeases) {
	s := &casLeases{objs: map[string]*coordinationv1.Lease{}, calls: map[string]int{}}
	c := fake.NewClientset()
	c.PrependReactor("*", "leases", s.react)
	c.PrependWatchReactor("leases", s.watch)
	return c, s
}

func key(ns, name string) string { return ns + "/" + name }

func (s *casLeases) get(ns, name string) *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.objs[key(ns, name)]; l != nil {
		return l.DeepCopy()
	}
	return nil
}

func (s *casLeases) setFail(f func(verb string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

// put stores l as another client would, bumping the resourceVersion.
func (s *casLeases) put(l *coordinationv1.Lease) *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeLocked(l.DeepCopy(), watch.Modified)
}

func (s *casLeases) storeLocked(l *coordinationv1.Lease, t watch.EventType) *coordinationv1.Lease {
	s.rv++
	l.ResourceVersion = strconv.Itoa(s.rv)
	if l.UID == "" {
		l.UID = types.UID("uid-" + strconv.Itoa(s.rv))
	}
	s.objs[key(l.Namespace, l.Name)] = l
	s.notifyLocked(t, l)
	return l.DeepCopy()
}

func (s *casLeases) notifyLocked(t watch.EventType, l *coordinationv1.Lease) {
	for _, w := range s.watchers {
		if w.ns == l.Namespace && (w.name == "" || w.name == l.Name) && !w.w.IsStopped() {
			w.w.Action(t, l.DeepCopy())
		}
	}
}

func (s *casLeases) react(a k8stesting.Action) (bool, runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	verb := a.GetVerb()
	s.calls[verb]++
	if s.fail != nil {
		if err := s.fail(verb); err != nil {
			return true, nil, err
		}
	}
	ns := a.GetNamespace()
	switch verb {
	case "get":
		a := a.(k8stesting.GetAction)
		l := s.objs[key(ns, a.GetName())]
		if l == nil {
			return true, nil, apierrors.NewNotFound(leaseGR, a.GetName())
		}
		return true, l.DeepCopy(), nil
	case "create":
		a := a.(k8stesting.CreateAction)
		l := a.GetObject().(*coordinationv1.Lease).DeepCopy()
		if l.Namespace == "" {
			l.Namespace = ns
		}
		if s.objs[key(ns, l.Name)] != nil {
			return true, nil, apierrors.NewAlreadyExists(leaseGR, l.Name)
		}
		return true, s.storeLocked(l, watch.Added), nil
	case "update":
		a := a.(k8stesting.UpdateAction)
		l := a.GetObject().(*coordinationv1.Lease).DeepCopy()
		cur := s.objs[key(ns, l.Name)]
		if cur == nil {
			return true, nil, apierrors.NewNotFound(leaseGR, l.Name)
		}
		if l.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(leaseGR, l.Name, nil)
		}
		l.UID = cur.UID
		return true, s.storeLocked(l, watch.Modified), nil
	case "delete":
		a := a.(k8stesting.DeleteAction)
		cur := s.objs[key(ns, a.GetName())]
		if cur == nil {
			return true, nil, apierrors.NewNotFound(leaseGR, a.GetName())
		}
		if p := a.GetDeleteOptions().Preconditions; p != nil {
			if (p.ResourceVersion != nil && *p.ResourceVersion != cur.ResourceVersion) || (p.UID != nil && *p.UID != cur.UID) {
				return true, nil, apierrors.NewConflict(leaseGR, a.GetName(), nil)
			}
		}
		delete(s.objs, key(ns, a.GetName()))
		s.rv++
		gone := cur.DeepCopy()
		gone.ResourceVersion = strconv.Itoa(s.rv)
		s.notifyLocked(watch.Deleted, gone)
		return true, nil, nil
	case "list":
		list := &coordinationv1.LeaseList{}
		for _, l := range s.objs {
			if ns == "" || l.Namespace == ns {
				list.Items = append(list.Items, *l.DeepCopy())
			}
		}
		return true, list, nil
	}
	return false, nil, nil
}

func (s *casLeases) watch(a k8stesting.Action) (bool, watch.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["watch"]++
	r := a.(k8stesting.WatchAction).GetWatchRestrictions()
	name, _ := r.Fields.RequiresExactMatch("metadata.name")
	w := &casWatch{ns: a.GetNamespace(), name: name, w: watch.NewRaceFreeFake()}
	s.watchers = append(s.watchers, w)
	// Deliver what the watcher missed since its resourceVersion, as the
	// API server would.
	from, _ := strconv.Atoi(r.ResourceVersion)
	if l := s.objs[key(w.ns, name)]; l != nil {
		if rv, _ := strconv.Atoi(l.ResourceVersion); rv > from {
			w.w.Modify(l.DeepCopy())
		}
	} else if from < s.rv {
		w.w.Delete(&coordinationv1.Lease{})
	}
	return true, w.w, nil
}
