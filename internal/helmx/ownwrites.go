// This tool's own writes under a lock (the controller's recovery): the
// fence carried in a request's context (WithFence) and the clients that
// look for it there (OwnWrites).

package helmx

import (
	"context"
	"net/http"

	"k8s.io/client-go/rest"
)

// fenceKey carries, in a context, the fence that judges the writes made
// under it (WithFence).
type fenceKey struct{}

// WithFence returns ctx for requests made under w's lock: on clients built
// from OwnWrites, their writes are judged by w.
func WithFence(ctx context.Context, w *WriteFence) context.Context {
	return context.WithValue(ctx, fenceKey{}, w)
}

// FenceOf returns the fence WithFence put in ctx, nil when none.
func FenceOf(ctx context.Context) *WriteFence {
	w, _ := ctx.Value(fenceKey{}).(*WriteFence)
	return w
}

// OwnWrites returns a copy of cfg for this tool's own clients in a process
// that holds several locks at once (the controller: its recovery's record
// and object writes). A write whose context carries a fence (WithFence)
// that guards a lock is judged by it as helm's writes are by theirs: it is
// refused once the lock is no longer valid or once an earlier write under
// it was cut off, and it is sent with the lock's renew deadline on its
// context and as the API server's own request timeout; every answer read
// under such a context feeds the lock's clock (ServerClockFeed). Unlike
// helm's, these writes are sent as they are: they are conditional on the
// resourceVersion they read and keep the lock annotations they read, which
// the fence's rewrite of helm's record writes would undo. Requests whose
// context carries no fence go out untouched.
func OwnWrites(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, ownWrites: true} })
	return out
}
