package lock

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// LeasePrefix starts the name of every lock Lease. The "v1" versions the
	// naming rule, not the record schema.
	LeasePrefix = "helm-autorecover.v1."

	// AnnotationRecord holds the JSON lock record on the Lease.
	AnnotationRecord = "helm-autorecover.io/lock"
	// AnnotationQueue holds the JSON queue of waiters on the Lease.
	AnnotationQueue = "helm-autorecover.io/queue"

	// LabelManagedBy and ManagedBy mark every Lease this package creates.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "helm-autorecover"
	// LabelRelease carries the release name, so locks can be listed per
	// release with a label selector.
	LabelRelease = "helm-autorecover.io/release"

	// MaxReleaseNameLen is Helm's limit on release names.
	MaxReleaseNameLen = 53
)

// LeaseName returns the name of the Lease that locks release.
//
// The rule is LeasePrefix + release. A legal Helm release name is a DNS-1123
// subdomain of at most 53 characters; the prefix is itself a DNS-1123
// subdomain ending in a dot, so the result is a DNS-1123 subdomain (the name
// rule for Leases) of at most 20+53 = 73 characters, well under the limit of
// 253. The release name is also a legal label value (at most 63 characters,
// alphanumeric at both ends), which LabelRelease relies on.
func LeaseName(release string) string {
	return LeasePrefix + release
}

// ValidateReleaseName reports whether release is a legal Helm release name,
// the precondition under which LeaseName is a legal Lease name.
func ValidateReleaseName(release string) error {
	if release == "" {
		return fmt.Errorf("release name is empty")
	}
	if len(release) > MaxReleaseNameLen {
		return fmt.Errorf("release name %q is longer than %d characters", release, MaxReleaseNameLen)
	}
	if errs := validation.IsDNS1123Subdomain(release); len(errs) > 0 {
		return fmt.Errorf("release name %q is not a DNS-1123 subdomain: %s", release, errs[0])
	}
	return nil
}

// LockLabels are the labels of the Lease locking release.
func LockLabels(release string) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedBy,
		LabelRelease:   release,
	}
}
