package protocol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
)

// The lock backends a client may choose (the CLI's --lock-backend).
const (
	BackendAuto    = "auto"
	BackendLease   = "lease"
	BackendRelease = "release"
)

// leaseVerbs are the rights on Leases that --lock-backend=auto asks for
// before it picks the lease backend.
var leaseVerbs = []string{"get", "create", "update"}

// Choice is a decision of --lock-backend=auto, with its reason.
type Choice struct {
	Backend string
	// Missing lists the Lease verbs the caller lacks (auto picked release).
	Missing []string
	Reason  string
}

// DecideAuto is auto's rule: lease when every verb in leaseVerbs is allowed,
// release otherwise. allowed maps a verb to the access review's answer; an
// error from the review counts as not allowed, since the release backend
// works with the rights helm needs anyway.
func DecideAuto(allowed map[string]bool, reviewErr error) Choice {
	if reviewErr != nil {
		return Choice{Backend: BackendRelease, Reason: fmt.Sprintf("cannot tell the rights on Leases (%v)", reviewErr)}
	}
	var missing []string
	for _, v := range leaseVerbs {
		if !allowed[v] {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return Choice{Backend: BackendRelease, Missing: missing, Reason: "no " + strings.Join(missing, ", ") + " on leases (coordination.k8s.io)"}
	}
	return Choice{Backend: BackendLease, Reason: "get, create and update on leases (coordination.k8s.io) are allowed"}
}

// chooseAuto asks the API server (SelfSubjectAccessReview) which Lease verbs
// the caller has in ns, once per connection and namespace.
func (c *Conn) chooseAuto(ctx context.Context, ns string) Choice {
	if ch, ok := c.autoChoice.Load(ns); ok {
		return ch.(Choice)
	}
	if ch, ok := c.memory.load(ns); ok {
		c.autoChoice.Store(ns, ch)
		return ch
	}
	client := c.client
	allowed := map[string]bool{}
	var reviewErr error
	for _, verb := range leaseVerbs {
		r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Group: "coordination.k8s.io", Resource: "leases",
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			reviewErr = err
			break
		}
		allowed[verb] = r.Status.Allowed
	}
	ch := DecideAuto(allowed, reviewErr)
	c.autoChoice.Store(ns, ch)
	if reviewErr == nil {
		// A review that failed is not remembered: it is asked again.
		c.memory.store(ns, ch)
	}
	return ch
}

// Stores resolves a lock backend choice (BackendAuto, BackendLease or
// BackendRelease) for a namespace into the stores to take, in order: the
// gate beside helm's records first (the lock on the release records, or
// the lock row in the sql driver's database; every client takes it, so
// clients of either backend exclude each other), then the Lease for the
// lease backend. It returns the backend chosen (auto resolved).
func (c *Conn) Stores(ctx context.Context, ns, choice string) (string, Stores, error) {
	gate, gateErr := c.GateBackend()
	if choice == BackendAuto {
		ch := c.chooseAuto(ctx, ns)
		choice = ch.Backend
		slog.Debug("helm-autorecover: lock backend auto chose "+choice, slog.String("namespace", ns), slog.String("reason", ch.Reason))
		if choice == BackendRelease && gateErr != nil {
			return "", Stores{}, fmt.Errorf("lock backend auto: %s, and %w; grant those verbs (see docs/rbac.md) or choose the lease backend once they are granted", ch.Reason, gateErr)
		}
	}
	switch choice {
	case BackendLease, BackendRelease:
	default:
		return "", Stores{}, fmt.Errorf("lock backend %q: must be auto, lease or release", choice)
	}
	if gateErr != nil {
		return "", Stores{}, fmt.Errorf("lock backend %s: %w", choice, gateErr)
	}
	if choice == BackendLease {
		return choice, Stores{list: []*lock.Backend{gate, c.Backend(leasestore.NewBackend(c.client, c.est, c.clock))}}, nil
	}
	return choice, Stores{list: []*lock.Backend{gate}}, nil
}

// Stores are the stores a release's lock lives in, in the order a take
// takes them (Conn.Stores). The doors pass them back to this package and
// never look inside.
type Stores struct{ list []*lock.Backend }

// Kinds names the stores, in order (lock.StoreKind: "release", "sql", "lease").
func (s Stores) Kinds() []string {
	out := make([]string, len(s.list))
	for i, b := range s.list {
		out[i] = string(b.Kind())
	}
	return out
}

// LeaseForbidden reports whether err is the API server refusing this caller
// a right on Leases (coordination.k8s.io): a reader of locks with the
// release backend's rights (docs/rbac.md) then reads the release records
// alone, whose lock every client takes first.
func LeaseForbidden(err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	d := se.Status().Details
	return d.Group == coordinationv1.GroupName || d.Kind == "leases"
}
