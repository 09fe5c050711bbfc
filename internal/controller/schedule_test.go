package controller

import (
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

func TestNext(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	margin := 250 * time.Millisecond
	for _, tc := range []struct {
		name string
		in   Observation
		want Step
	}{
		{"expired lock: recover now", Observation{Decision: recovery.Decision{Verdict: recovery.Recover}}, Step{Recover: true}},
		{"rollback strategy: recover now", Observation{Decision: recovery.Decision{Verdict: recovery.RecoverThenRollback}}, Step{Recover: true}},
		{"opted out, even when recoverable", Observation{Ignored: true, Decision: recovery.Decision{Verdict: recovery.Recover}}, Step{}},
		{"not pending", Observation{Decision: recovery.Decision{Verdict: recovery.Proceed}}, Step{}},
		{"gone", Observation{Decision: recovery.Decision{Verdict: recovery.NoRelease}}, Step{}},
		{
			"live holder: at its LOCKED TILL + margin",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}, Live: true, LockedTill: now.Add(10 * time.Second), Margin: margin, NowEarliest: now},
			Step{After: 10*time.Second + margin},
		},
		{
			"live holder at its edge: not a tight loop",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}, Live: true, LockedTill: now.Add(-time.Second), Margin: margin, NowEarliest: now},
			Step{After: minRequeue},
		},
		{
			"expired too recently to trust the Date header alone: when it is confirmed",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}, Live: true, LockedTill: now.Add(-2 * time.Second), Margin: margin, NowEarliest: now, ConfirmIn: 9 * time.Second},
			Step{After: 9 * time.Second},
		},
		{
			"live by a server clock that runs behind, expired sooner on the controller's own: then",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}, Live: true, LockedTill: now.Add(10 * time.Minute), Margin: margin, NowEarliest: now, ConfirmIn: 12 * time.Second},
			Step{After: 12 * time.Second},
		},
		{
			"young legacy pending revision: when it becomes recoverable",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked, RetryAfter: 14 * time.Minute}},
			Step{After: 14 * time.Minute},
		},
		{
			"holder released early: when it has certainly stopped writing",
			Observation{Decision: recovery.Decision{Verdict: recovery.Blocked, RetryAfter: 3 * time.Second, HolderMayWrite: true}},
			Step{After: 3 * time.Second},
		},
		{"blocked for good (legacy-after 0): wait for a change", Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}}, Step{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Next(tc.in)
			got.Why = ""
			if got != tc.want {
				t.Errorf("Next = %+v, want %+v", got, tc.want)
			}
		})
	}
}
