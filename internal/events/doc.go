// Package events records Kubernetes Events (events.k8s.io/v1) about what
// helm-autorecover did to a release: an automatic recovery, a manual
// recovery, an unlock and a forced unlock. Each Event regards the release's
// latest revision Secret, so `kubectl get events -n NS` and `kubectl describe
// secret` tell the story next to helm's own records.
//
// Events are best effort: a client without the right to create Events still
// recovers and unlocks; the functions here return the error for the caller to
// print as a warning.
package events
