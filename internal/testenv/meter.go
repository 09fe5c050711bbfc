package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// MeteredWrite is one write to a Secret, ConfigMap or Lease seen by a
// Meter: a new version of the object (a create or an update), and its size
// as JSON with its managed fields, which is what etcd keeps of it (etcd
// stores protobuf, a little smaller).
type MeteredWrite struct {
	Resource string // secrets, configmaps or leases
	Name     string
	Bytes    int
	At       time.Time
}

// Meter records every version written of the Secrets, ConfigMaps and
// Leases in one namespace, from watches opened when it starts: each ADDED
// or MODIFIED event is one write. Deletes are not counted.
type Meter struct {
	mu     sync.Mutex
	writes []MeteredWrite
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// StartMeter starts metering namespace ns.
func StartMeter(ctx context.Context, client kubernetes.Interface, ns string) (*Meter, error) {
	ctx, cancel := context.WithCancel(ctx)
	m := &Meter{cancel: cancel}
	type opener struct {
		resource string
		list     func() (string, error)
		watch    func(rv string) (watch.Interface, error)
	}
	opts := func(rv string) metav1.ListOptions { return metav1.ListOptions{ResourceVersion: rv} }
	openers := []opener{
		{"secrets", func() (string, error) {
			l, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return "", err
			}
			return l.ResourceVersion, nil
		}, func(rv string) (watch.Interface, error) { return client.CoreV1().Secrets(ns).Watch(ctx, opts(rv)) }},
		{"configmaps", func() (string, error) {
			l, err := client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return "", err
			}
			return l.ResourceVersion, nil
		}, func(rv string) (watch.Interface, error) { return client.CoreV1().ConfigMaps(ns).Watch(ctx, opts(rv)) }},
		{"leases", func() (string, error) {
			l, err := client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return "", err
			}
			return l.ResourceVersion, nil
		}, func(rv string) (watch.Interface, error) {
			return client.CoordinationV1().Leases(ns).Watch(ctx, opts(rv))
		}},
	}
	for _, o := range openers {
		rv, err := o.list()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("metering %s in namespace %q: %w", o.resource, ns, err)
		}
		w, err := o.watch(rv)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("metering %s in namespace %q: %w", o.resource, ns, err)
		}
		m.done.Add(1)
		go func() {
			defer m.done.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if ev.Type != watch.Added && ev.Type != watch.Modified {
						continue
					}
					b, err := json.Marshal(ev.Object)
					acc, aerr := metaOf(ev.Object)
					if err != nil || aerr != nil {
						continue
					}
					m.mu.Lock()
					m.writes = append(m.writes, MeteredWrite{Resource: o.resource, Name: acc, Bytes: len(b), At: time.Now()})
					m.mu.Unlock()
				}
			}
		}()
	}
	return m, nil
}

func metaOf(obj any) (string, error) {
	if o, ok := obj.(metav1.Object); ok {
		return o.GetName(), nil
	}
	return "", fmt.Errorf("not an object: %T", obj)
}

// Stop ends the watches.
func (m *Meter) Stop() {
	m.cancel()
	m.done.Wait()
}

// Writes returns the writes seen so far, in the order they arrived per
// resource.
func (m *Meter) Writes() []MeteredWrite {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]MeteredWrite(nil), m.writes...)
}

// WaitFor waits until the meter has seen at least n writes to the object
// named name or ctx ends: watch events trail the writes they report.
func (m *Meter) WaitFor(ctx context.Context, resource, name string, n int) error {
	for {
		count := 0
		for _, w := range m.Writes() {
			if w.Resource == resource && w.Name == name {
				count++
			}
		}
		if count >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("meter saw %d of %d writes to %s %s: %w", count, n, resource, name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Incompressible is n bytes of seeded random text (every call alike): set
// as a release's value (helm --set-file), it makes the release's record
// about that large, however helm compresses it.
func Incompressible(n int) []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	r := rand.New(rand.NewPCG(18, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}
