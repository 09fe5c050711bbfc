package lock

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"
)

// TestRereadAfterConflictIsFloored: a holder's write that the release
// store refuses after reading (here a renewal finding the beat changed by a
// waiter's heartbeat) is followed by a re-read and a second read in the
// write, both served not older than what the refused write read
// (resourceVersionMatch NotOlderThan), not fully consistent reads, which
// right after a write wait for the API server's cache to confirm it is
// current.
func TestRereadAfterConflictIsFloored(t *testing.T) {
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter's heartbeat: the beat changes under the holder.
	b := w.beat(t)
	b.Annotations[AnnotationWaiters] = `[{"s":"waiter","e":1,"x":1}]`
	if _, err := w.cs.CoreV1().Secrets(ns).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := len(w.cs.Actions())
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("renewal after the beat changed: %v", err)
	}
	var lists []metav1.ListOptions
	for _, a := range w.cs.Actions()[n:] {
		if l, ok := a.(k8stesting.ListActionImpl); ok && a.GetResource().Resource == "secrets" {
			lists = append(lists, l.ListOptions)
		}
	}
	if len(lists) != 3 {
		t.Fatalf("the renewal listed the records %d times; want 3 (the refused write, the re-read, the write again): %+v", len(lists), lists)
	}
	if lists[0].ResourceVersionMatch != "" {
		t.Errorf("the first read was floored: %+v", lists[0])
	}
	for i, l := range lists[1:] {
		if l.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan || l.ResourceVersion == "" {
			t.Errorf("read %d after the conflict is not floored: %+v", i+2, l)
		}
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
