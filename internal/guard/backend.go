package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// The values of --lock-backend.
const (
	BackendAuto    = "auto"
	BackendLease   = "lease"
	BackendRelease = "release"
)

// leaseVerbs are the rights on Leases that --lock-backend=auto asks for
// before it picks the lease backend.
var leaseVerbs = []string{"get", "create", "update"}

// autoChoice caches auto's decision per namespace: it is made once per
// process.
var autoChoice sync.Map // namespace -> string

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
// the caller has in ns, once per process and namespace.
func chooseAuto(ctx context.Context, client kubernetes.Interface, ns string) Choice {
	if c, ok := autoChoice.Load(ns); ok {
		return c.(Choice)
	}
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
	c := DecideAuto(allowed, reviewErr)
	autoChoice.Store(ns, c)
	return c
}

// backends resolves --lock-backend for the operation's namespace and helm
// driver into the stores to take, in order: the release record's lock first
// (every client takes it, so clients of either backend exclude each other),
// then the Lease for the lease backend. The sql driver has no record: lease
// takes the Lease alone, release is refused.
func (g *Guard) backends(ctx context.Context, client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, ns string) (string, []*lock.LeaseBackend, error) {
	choice := g.Options.LockBackend
	driver, driverErr := records.ParseDriver(g.HelmDriver)
	if choice == BackendAuto {
		c := chooseAuto(ctx, client, ns)
		choice = c.Backend
		slog.Debug("helm-autorecover: --lock-backend=auto chose "+choice, slog.String("namespace", ns), slog.String("reason", c.Reason))
		if choice == BackendRelease && errors.Is(driverErr, records.ErrNoReleaseRecords) {
			return "", nil, fmt.Errorf("--lock-backend=auto: %s, and %w; grant those verbs (see docs/rbac.md) or pass --lock-backend=lease once they are granted", c.Reason, driverErr)
		}
	}
	leases := lock.NewLeaseBackend(client, est, clk)
	switch {
	case errors.Is(driverErr, records.ErrNoReleaseRecords) && choice == BackendLease:
		return choice, []*lock.LeaseBackend{leases}, nil
	case driverErr != nil:
		return "", nil, fmt.Errorf("--lock-backend=%s: %w", choice, driverErr)
	}
	records := lock.NewReleaseBackend(client, est, clk, driver)
	if choice == BackendLease {
		return choice, []*lock.LeaseBackend{records, leases}, nil
	}
	return choice, []*lock.LeaseBackend{records}, nil
}
