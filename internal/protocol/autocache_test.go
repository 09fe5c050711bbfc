package protocol

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestAutoMemory: a choice is remembered per server, credentials and
// namespace, for TTL; forgetting it, or another identity, asks again.
func TestAutoMemory(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	mem := func(cfg *rest.Config) *AutoMemory {
		return &AutoMemory{Dir: t.TempDir(), TTL: time.Hour, id: identity(cfg), now: func() time.Time { return now }}
	}
	admin := &rest.Config{Host: "https://a:6443", BearerToken: "admin-token"}
	m := mem(admin)
	if _, ok := m.load("shop"); ok {
		t.Fatal("a choice found in an empty memory")
	}
	m.store("shop", Choice{Backend: BackendLease, Reason: "allowed"})
	if ch, ok := m.load("shop"); !ok || ch.Backend != BackendLease {
		t.Fatalf("load = %+v, %v; want the lease backend", ch, ok)
	}
	if _, ok := m.load("other"); ok {
		t.Error("a choice for shop found for namespace other")
	}
	other := *m
	other.id = identity(&rest.Config{Host: "https://a:6443", BearerToken: "deployer-token"})
	if _, ok := other.load("shop"); ok {
		t.Error("the admin's choice found for other credentials")
	}
	now = now.Add(time.Hour + time.Second)
	if _, ok := m.load("shop"); ok {
		t.Error("a choice older than TTL trusted")
	}
	now = now.Add(-time.Hour)
	m.forget("shop")
	if _, ok := m.load("shop"); ok {
		t.Error("a forgotten choice found")
	}
	var none *AutoMemory
	none.store("shop", Choice{Backend: BackendLease})
	if _, ok := none.load("shop"); ok {
		t.Error("a nil memory remembered")
	}
}
