package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// benchLabel marks the namespaces of one run (its value is the run's stamp).
const benchLabel = "helm-autorecover.io/bench-controller"

// release is one release of the benchmark.
type release struct {
	ns, name string
	pending  bool

	// Of a pending release: the lease its dead holder took, the session,
	// and its LOCKED TILL in server time (the latest of its stores').
	lease      time.Duration
	session    string
	lockedTill time.Time
	// seenFailed is when the watch saw revision 4 failed; logged when the
	// controller logged "recovered" (its own clock, the same machine's).
	seenFailed time.Time
	logged     time.Time
}

// due is the moment the release becomes recoverable: LOCKED TILL plus the
// takeover margin every client adds.
func (r *release) due() time.Time { return r.lockedTill.Add(lock.TakeoverMargin) }

func nsName(stamp string, i int) string { return fmt.Sprintf("bench-ctl-%s-%03d", stamp, i) }

// plan lays out the releases: perNS per namespace, the one in the middle
// of every releases/pending releases pending (one per namespace with
// the defaults).
func plan(stamp string, namespaces, releases, pending int) []*release {
	perNS := releases / namespaces
	every := releases / max(pending, 1)
	out := make([]*release, 0, releases)
	n := 0
	for i := range releases {
		ns := min(i/perNS, namespaces-1)
		r := &release{ns: nsName(stamp, ns), name: fmt.Sprintf("rel-%05d", i)}
		if pending > 0 && i%every == every/2 && n < pending {
			r.pending = true
			n++
		}
		out = append(out, r)
	}
	return out
}

// createNamespaces creates the run's namespaces, labelled for clean-up.
func createNamespaces(ctx context.Context, cs kubernetes.Interface, stamp string, n, workers int) error {
	return parallel(ctx, n, workers, func(i int) error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: nsName(stamp, i), Labels: map[string]string{benchLabel: stamp},
		}}, metav1.CreateOptions{})
		return err
	})
}

// recordSecret is revision rev of r as helm's secret driver stores it:
// named sh.helm.release.v1.NAME.vREV, of type helm.sh/release.v1, with
// helm's labels, and data.release the base64 of the gzipped release JSON
// (helmx.EncodeReleaseJSON, the codec helm's records are read with).
func recordSecret(r *release, rev int, status common.Status, at time.Time) (*corev1.Secret, error) {
	desc := "Upgrade complete"
	switch {
	case status == common.StatusPendingUpgrade:
		desc = "Preparing upgrade"
	case rev == 1:
		desc = "Install complete"
	}
	first := at.Add(-time.Duration(4) * time.Hour)
	rel := &rspb.Release{
		Name:      r.name,
		Namespace: r.ns,
		Version:   rev,
		Manifest:  "",
		Info: &rspb.Info{
			Status: status, Description: desc,
			FirstDeployed: first, LastDeployed: first.Add(time.Duration(rev) * time.Hour),
		},
		Chart: &chart.Chart{Metadata: &chart.Metadata{
			APIVersion: "v2", Name: "app", Version: fmt.Sprintf("0.1.%d", rev), AppVersion: "1.0.0",
		}},
		Config: map[string]any{},
	}
	doc, err := json.Marshal(rel)
	if err != nil {
		return nil, err
	}
	data, err := helmx.EncodeReleaseJSON(doc)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		helmx.LabelName:      r.name,
		helmx.LabelOwner:     helmx.OwnerHelm,
		helmx.LabelStatus:    status.String(),
		helmx.LabelVersion:   strconv.Itoa(rev),
		helmx.LabelCreatedAt: strconv.FormatInt(first.Add(time.Duration(rev)*time.Hour).Unix(), 10),
	}
	if status == common.StatusSuperseded {
		// helm's Update (marking it superseded) adds modifiedAt.
		labels[helmx.LabelModifiedAt] = strconv.FormatInt(first.Add(time.Duration(rev+1)*time.Hour).Unix(), 10)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: helmx.ReleaseSecretName(r.name, rev), Namespace: r.ns, Labels: labels},
		Type:       helmx.ReleaseSecretType,
		Data:       map[string][]byte{helmx.ReleaseDataKey: data},
	}, nil
}

// statusOf is revision rev's status out of revisions: superseded, then
// deployed for the newest; a pending release's newest revision is
// pending-upgrade (written under its holder's lock, see takeLocks) and the
// one before stays deployed, as helm leaves it until the upgrade succeeds.
func statusOf(r *release, rev, revisions int) common.Status {
	switch {
	case rev == revisions:
		return common.StatusDeployed
	case r.pending && rev == revisions-1:
		return common.StatusDeployed
	}
	return common.StatusSuperseded
}

// createRecords writes every revision of every release (but the pending
// revisions, which takeLocks writes) with workers in parallel, printing
// progress; it returns how many it created.
func createRecords(ctx context.Context, cs kubernetes.Interface, rels []*release, revisions, workers int) (int, error) {
	type job struct {
		r   *release
		rev int
	}
	var jobs []job
	for _, r := range rels {
		for rev := 1; rev <= revisions; rev++ {
			if r.pending && rev == revisions {
				continue
			}
			jobs = append(jobs, job{r, rev})
		}
	}
	var done atomic.Int64
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n := done.Load()
				fmt.Fprintf(os.Stderr, "  %d/%d Secrets, %.0f/s\n", n, len(jobs), float64(n)/time.Since(start).Seconds())
			}
		}
	}()
	now := time.Now()
	err := parallel(ctx, len(jobs), workers, func(i int) error {
		j := jobs[i]
		sec, err := recordSecret(j.r, j.rev, statusOf(j.r, j.rev, revisions), now)
		if err != nil {
			return err
		}
		if _, err := cs.CoreV1().Secrets(j.r.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s/%s: %w", sec.Namespace, sec.Name, err)
		}
		done.Add(1)
		return nil
	})
	return int(done.Load()), err
}

// takeLocks has a dead holder leave each pending release exactly as our
// CLI's upgrade does when it is SIGKILLed after helm wrote the pending
// revision: it takes the release's lock with the CLI's backend choice
// (protocol.Conn.Take: the gate on the newest record, the
// beat Secret helm-autorecover.v1.NAME, and the Lease under the lease
// backend), records the revision it writes (SetRevision), writes that
// revision pending-upgrade with the lock carried in its create (Carry, as
// the CLI's write fence does), then stops: no renewal, no release. Each
// lock's LOCKED TILL is read back as `helm-autorecover locks` reads it.
func takeLocks(ctx context.Context, conn *protocol.Conn, cs kubernetes.Interface, backend string, pend []*release, revisions, workers int) error {
	now := time.Now()
	return parallel(ctx, len(pend), workers, func(i int) error {
		r := pend[i]
		timeout := 5 * time.Minute // helm's default --timeout
		held, err := conn.Take(ctx, protocol.Request{
			Release: r.name, Namespace: r.ns, Operation: protocol.OpUpgrade, Backend: backend,
			Timeout: timeout, LeaseDuration: r.lease, MaxHold: guard.DefaultMaxHold(timeout),
		})
		if err != nil {
			return fmt.Errorf("locking %s/%s: %w", r.ns, r.name, err)
		}
		r.session = held.Session()
		if err := held.SetRevision(ctx, revisions); err != nil {
			return err
		}
		sec, err := recordSecret(r, revisions, common.StatusPendingUpgrade, now)
		if err != nil {
			return err
		}
		err = held.Carry(func(rec lock.Record) error {
			rec.Revision = revisions
			s, err := rec.Encode()
			if err != nil {
				return err
			}
			sec.Annotations = map[string]string{lock.AnnotationRecord: s}
			_, err = cs.CoreV1().Secrets(r.ns).Create(ctx, sec, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("writing the pending revision of %s/%s: %w", r.ns, r.name, err)
		}
		// The holder dies here: held is dropped, never renewed nor released.
		_, stores, err := conn.Stores(ctx, r.ns, backend)
		if err != nil {
			return err
		}
		parts, err := conn.InspectParts(ctx, r.ns, r.name, stores)
		if err != nil {
			return err
		}
		for i, st := range parts {
			if st.State != protocol.Live {
				return fmt.Errorf("%s/%s: the lock just taken reads %s in its part %d", r.ns, r.name, st.State, i+1)
			}
			if st.LockedTill.After(r.lockedTill) {
				r.lockedTill = st.LockedTill
			}
		}
		return nil
	})
}

// parallel runs f(0..n-1) on at most workers goroutines and returns the
// first error (the others stop taking work).
func parallel(ctx context.Context, n, workers int, f func(i int) error) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		failed   atomic.Bool
	)
	for range min(max(workers, 1), max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() && ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}
