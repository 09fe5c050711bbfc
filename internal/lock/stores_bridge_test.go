package lock_test

import (
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
)

// The engine's own tests (package lock) reach the stores through
// lock.Stores, filled here before any test runs.
func init() {
	s := &lock.Stores
	s.LeaseBackend, s.ReleaseBackend = leasestore.NewBackend, releasestore.NewBackend
	s.LeaseStore = func(client kubernetes.Interface, ns string) lock.Store {
		if client == nil {
			return leasestore.New(nil, ns)
		}
		return leasestore.New(client.CoordinationV1().Leases(ns), ns)
	}
	s.ReleaseStore = releasestore.NewStore
	s.LeaseSnapshot, s.SetHolder, s.SetQueue = leasestore.Snapshot, leasestore.SetHolder, leasestore.SetQueue
	s.ReleaseSnapshot, s.GateRecord, s.GateEffective = releasestore.Snapshot, releasestore.GateRecord, releasestore.GateEffective
	s.EncodeBeat, s.DecodeBeat = releasestore.EncodeBeat, releasestore.DecodeBeat
	s.EncodeWaiters, s.DecodeWaiters = releasestore.EncodeWaiters, releasestore.DecodeWaiters
	s.AnnotationBeat, s.AnnotationWaiters = releasestore.AnnotationBeat, releasestore.AnnotationWaiters
	s.AnnotationClaimedFrom, s.AnnotationClaimedOn = releasestore.AnnotationClaimedFrom, releasestore.AnnotationClaimedOn
}
