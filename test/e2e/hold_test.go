package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestLongHolderKeepsLock is invariant S3: helm applies --timeout per hook
// and per wait, so one upgrade with a slow pre-upgrade hook, slow readiness
// and a slow post-upgrade hook lasts about three times its --timeout, and
// many times its lease. A live holder that keeps renewing keeps its lock
// all along: a second client trying every 500 ms is refused every time, no
// other session ever holds the Lease, and no one but the holder writes the
// release (its revision is never marked failed).
func TestLongHolderKeepsLock(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "slow"
	const (
		timeout = 10 * time.Second
		// The upgrade lasts more than three phases of 7.5 s: over four
		// leases. A 3 s lease (renew deadline 2 s after the last renewal
		// was sent) lost the lock once on the loaded 2-core CI machine
		// while e2e ran beside another package's tests.
		leaseDur = 5 * time.Second
		// Each phase is released this long after its pod appears. A hook's
		// Job completes up to about 1.5 s after its pod is bound (the Job
		// controller batches pod updates), so this leaves a second of margin
		// under --timeout even on a busy machine.
		phaseHold = 7500 * time.Millisecond
	)
	node := kwokNode(t, env)
	hooks := []string{"--set", "hook=true", "--set", `hookEvents=pre-upgrade\,post-upgrade`}
	mustRun(t, env, ha, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, hooks)...)

	lw := watchLease(t, env, ns, rel)
	sw := watchStatuses(t, env, ns, rel)
	holder := env.Start(t, ha, args([]string{
		"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", timeout.String(),
		"--lease-duration", leaseDur.String(), "--set", "message=slow",
	}, hooks, hookUnschedulable, unschedulable)...)
	start := time.Now()
	rec := waitForWriter(t, env, ns, rel, 2, 30*time.Second)

	// The contender tries every 500 ms until the holder is done.
	var (
		mu       sync.Mutex
		attempts []int
		tried    []time.Time // when each attempt started
		bad      []string
	)
	stop := make(chan struct{})
	contended := make(chan struct{})
	go func() {
		defer close(contended)
		for {
			select {
			case <-stop:
				return
			default:
			}
			at := time.Now()
			code, stderr, err := runQuiet(env, ha, "upgrade", rel, chart, "-n", ns, "--set", "message=contender")
			mu.Lock()
			attempts = append(attempts, code)
			tried = append(tried, at)
			if err != nil || code != exitcode.Locked || !strings.Contains(stderr, rec.Session) {
				bad = append(bad, fmt.Sprintf("exit %d, err %v: %s", code, err, stderr))
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()

	// Three phases, each held open for phaseHold (under --timeout), then
	// released by binding the waiting pod past its unsatisfiable selector.
	phases := []struct{ name, selector string }{
		{"pre-upgrade hook", "job-name=" + rel + "-hook"},
		{"readiness", "app=" + rel},
		{"post-upgrade hook", "job-name=" + rel + "-hook"},
	}
	// The contender stops shortly before the last phase ends, so that every
	// attempt falls while the holder is alive and none can legitimately win.
	stopContender := func() {
		close(stop)
		<-contended
	}
	var windows [][2]time.Time // each phase's, while the contender tries
	for i, ph := range phases {
		var pods []corev1.Pod
		deadline := time.Now().Add(60 * time.Second)
		for len(pods) == 0 && time.Now().Before(deadline) {
			pods = pendingPods(t, env, ns, ph.selector)
			if len(pods) == 0 {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if len(pods) == 0 {
			t.Fatalf("%s: no pending pod %q appeared; holder stderr:\n%s", ph.name, ph.selector, holder.Stderr.String())
		}
		began := time.Now()
		if i == len(phases)-1 {
			time.Sleep(phaseHold - time.Second) // the phase's length: the scenario, not a synchronisation
			windows = append(windows, [2]time.Time{began, time.Now()})
			stopContender()
		}
		time.Sleep(time.Until(began.Add(phaseHold))) // the phase's length
		if i < len(phases)-1 {
			windows = append(windows, [2]time.Time{began, time.Now()})
		}
		for _, p := range pods {
			bind(t, env, ns, p, node)
		}
		t.Logf("%s: started %s after the upgrade, released after %s", ph.name, secs(began.Sub(start)), secs(phaseHold))
	}
	code := holder.Wait(t, 2*time.Minute)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("holder: exit %d\nstderr:\n%s", code, holder.Stderr.String())
	}
	waitLockFree(t, env, ns, rel, 30*time.Second)
	// Each watch delivers events in order: once it delivered the holder's
	// release (the Lease) and its deployed revision (the Secrets), it
	// delivered everything written before them.
	for deadline := time.Now().Add(time.Minute); ; {
		_, released := firstEvent(lw.snapshot(), func(e leaseEvent) bool { return e.holder == "" && e.rec != nil && e.rec.Session == rec.Session })
		deployed := slices.Contains(sw.snapshot(), "2:deployed")
		if released && deployed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watches did not deliver the holder's release (%v) and its deployed revision (%v) within a minute", released, deployed)
		}
		time.Sleep(20 * time.Millisecond)
	}

	mu.Lock()
	defer mu.Unlock()
	figure(t, "long holder: ran %s = %.1f x --timeout %s = %.1f leases of %s; contender refused %d/%d times",
		secs(took), took.Seconds()/timeout.Seconds(), timeout, took.Seconds()/leaseDur.Seconds(), leaseDur, len(attempts)-len(bad), len(attempts))
	if took < 2*timeout {
		t.Errorf("the upgrade lasted %s; the scenario needs well over 2 x --timeout (%s)", took.Round(time.Millisecond), 2*timeout)
	}
	for i, w := range windows {
		if !slices.ContainsFunc(tried, func(at time.Time) bool { return !at.Before(w[0]) && at.Before(w[1]) }) {
			t.Errorf("no contender attempt started during the %s phase; the scenario needs the lock contended in each", phases[i].name)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d contender attempts were not refused with exit %d naming session %s:\n%s", len(bad), exitcode.Locked, rec.Session, strings.Join(bad, "\n"))
	}
	for _, e := range lw.snapshot() {
		if e.holder != "" && e.holder != rec.Session {
			t.Errorf("session %s held the lock at %s while the holder %s was alive", e.holder, e.at.Format(time.StampMilli), rec.Session)
		}
	}
	for _, s := range sw.snapshot() {
		if strings.HasSuffix(s, ":failed") {
			t.Errorf("a revision was marked failed while the holder was alive; statuses seen: %v", sw.snapshot())
			break
		}
	}
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:deployed")
	if !strings.Contains(revs[1].Description, "Upgrade complete") {
		t.Errorf("revision 2 description = %q", revs[1].Description)
	}
}

// runQuiet runs a command outside the test goroutine's helpers (which may
// not fail the test from another goroutine).
func runQuiet(env *testenv.Env, bin string, a ...string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, a...)
	cmd.Env = env.HelmEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode(), stderr.String(), nil
	}
	return 0, stderr.String(), err
}

// statusWatch records every status label the release's Secrets take.
type statusWatch struct {
	mu       sync.Mutex
	statuses []string
}

func watchStatuses(t *testing.T, env *testenv.Env, ns, rel string) *statusWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := env.Client.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + rel})
	if err != nil {
		cancel()
		t.Fatalf("watching the revisions of %s/%s: %v", ns, rel, err)
	}
	sw := &statusWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok {
				sw.mu.Lock()
				sw.statuses = append(sw.statuses, s.Labels["version"]+":"+s.Labels["status"])
				sw.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		cancel()
		<-done
	})
	return sw
}

// snapshot returns the statuses seen so far, as "rev:status".
func (sw *statusWatch) snapshot() []string {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return append([]string(nil), sw.statuses...)
}
