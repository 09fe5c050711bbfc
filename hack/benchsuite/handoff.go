package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot/vg"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/hack/internal/countproxy"
)

// The handoff scenario: a chain of upgrade --wait of one release, each
// queued with --lock-timeout behind the one before. A holder's pods use a
// scheduler that does not exist, so its --wait lasts until the bench binds
// them to the node itself, once the next client is queued; the holder then
// succeeds and releases, and the waiter takes the lock. Times come from the
// counting proxy (every client of the chain goes through it, as one of two
// tags taken in turn), in the bench's clock.

// holdScheduler is the scheduler of the handoff chart's pods: none such
// runs, so they stay Pending until bound.
const holdScheduler = "bench-suite-hold"

// handoff is one handoff from a holder to the waiter queued behind it.
type handoff struct {
	n int
	// released: the answer to the holder's last write (its lock's
	// release); exited: the holder's exit; took: the waiter's first write
	// of the release's records (taking the lock on them).
	released, exited, took time.Time
	holderRequests         int
	waiterRequests         int // while queued, before took
}

// gap is from the holder's release to the waiter's take; exitGap from the
// holder's exit.
func (h handoff) gap() float64     { return h.took.Sub(h.released).Seconds() }
func (h handoff) exitGap() float64 { return h.took.Sub(h.exited).Seconds() }

type handoffResult struct {
	handoffs []handoff
	history  string
}

func (s *suite) handoff(ctx context.Context) (*handoffResult, error) {
	ns, err := s.namespace(ctx, "handoff")
	if err != nil {
		return nil, err
	}
	node, err := s.node(ctx)
	if err != nil {
		return nil, err
	}
	const rel = "handoff"
	tags := []string{"handoff-a", "handoff-b"}
	// Each upgrade rolls its pods out (rollPods), and they wait for the
	// hold scheduler.
	values := []string{"--set", "deployments=1", "--set", "rollPods=true", "--set", "schedulerName=" + holdScheduler}
	if _, err := s.mustRun(ctx, "", s.o.bin, append([]string{"install", rel, s.o.mediumChart, "-n", ns}, values...)...); err != nil {
		return nil, err
	}
	if err := s.bindHeld(ctx, ns, node); err != nil {
		return nil, err
	}
	upgrade := func(n int) (*proc, error) {
		args := append([]string{
			"upgrade", rel, s.o.mediumChart, "-n", ns, "--wait", "--timeout", "10m",
			"--lock-timeout", "10m", "--set", fmt.Sprintf("message=h%d", n),
		}, values...)
		return s.start(ctx, tags[n%2], s.o.bin, args...)
	}
	fmt.Fprintf(os.Stderr, "  %d handoffs\n", s.o.handoffs)
	holder, err := upgrade(0)
	if err != nil {
		return nil, err
	}
	defer func() { holder.kill() }()
	if err := s.waitStatus(ctx, ns, rel, 2, "pending-upgrade", 2*time.Minute); err != nil {
		return nil, err
	}
	res := &handoffResult{}
	for n := 1; n <= s.o.handoffs; n++ {
		waiter, err := upgrade(n)
		if err != nil {
			return res, err
		}
		// Queued: the waiter wrote (its place in the queue) or says it waits.
		if err := waitFor(ctx, fmt.Sprintf("upgrade %d to queue", n), 2*time.Minute, 20*time.Millisecond, func() (bool, error) {
			if len(s.writes(tags[n%2], waiter.start, time.Now())) > 0 || strings.Contains(waiter.stderr.String(), "waiting for the lock") {
				return true, nil
			}
			select {
			case <-waiter.done:
				return false, fmt.Errorf("upgrade %d ended before it was queued: %w", n, waiter.err())
			default:
				return false, nil
			}
		}); err != nil {
			waiter.kill()
			return res, err
		}
		if err := s.bindHeld(ctx, ns, node); err != nil {
			waiter.kill()
			return res, err
		}
		if err := holder.wait().err(); err != nil {
			waiter.kill()
			return res, fmt.Errorf("holder %d: %w", n-1, err)
		}
		if err := s.waitStatus(ctx, ns, rel, n+2, "pending-upgrade", 2*time.Minute); err != nil {
			waiter.kill()
			return res, fmt.Errorf("%w (upgrade %d: %s)", err, n, tail(waiter.stderr.String(), 500))
		}
		h, err := s.handoffTimes(n, rel, holder, waiter, tags[(n-1)%2], tags[n%2])
		if err != nil {
			waiter.kill()
			return res, err
		}
		res.handoffs = append(res.handoffs, h)
		holder = waiter
	}
	if err := s.bindHeld(ctx, ns, node); err != nil {
		return res, err
	}
	if err := holder.wait().err(); err != nil {
		return res, fmt.Errorf("the last holder: %w", err)
	}
	res.history = s.describeHistory(ctx, ns, rel)
	return res, nil
}

// writes are the write requests of client tag that reached the proxy in
// [from, to].
func (s *suite) writes(tag string, from, to time.Time) []countproxy.Request {
	return s.px.Requests(func(r countproxy.Request) bool {
		return r.Client == tag && r.Write() && !r.Start.Before(from) && !r.Start.After(to)
	})
}

// handoffTimes reads from the proxy's log when the holder released the
// lock and when the waiter took it.
func (s *suite) handoffTimes(n int, rel string, holder, waiter *proc, holderTag, waiterTag string) (handoff, error) {
	h := handoff{n: n, exited: holder.end}
	record := "sh.helm.release.v1." + rel + "."
	for _, r := range s.writes(waiterTag, waiter.start, time.Now()) {
		if r.Resource == "secrets" && (strings.HasPrefix(r.Name, record) || r.Verb == "create" && r.Name == "") {
			h.took = r.Start
			break
		}
		h.waiterRequests++
	}
	if h.took.IsZero() {
		return h, fmt.Errorf("handoff %d: the waiter wrote none of the release's records", n)
	}
	for _, r := range s.writes(holderTag, holder.start, holder.end) {
		if r.Start.Before(h.took) && r.End.After(h.released) {
			h.released = r.End
		}
		h.holderRequests++
	}
	if os.Getenv("BENCHSUITE_DEBUG") != "" {
		for _, r := range s.px.Requests(func(r countproxy.Request) bool {
			return (r.Client == holderTag || r.Client == waiterTag) && r.Write() && !r.Start.Before(holder.start)
		}) {
			fmt.Fprintf(os.Stderr, "    %s %s %s %s %s +%.3f..%.3f\n", r.Client, r.Verb, r.Resource, r.Name, r.Phase, r.Start.Sub(holder.start).Seconds(), r.End.Sub(holder.start).Seconds())
		}
		fmt.Fprintf(os.Stderr, "    handoff %d: release +%.3f, exit +%.3f, take +%.3f\n", n, h.released.Sub(holder.start).Seconds(), holder.end.Sub(holder.start).Seconds(), h.took.Sub(holder.start).Seconds())
	}
	return h, nil
}

// node is the cluster's (kwok) node.
func (s *suite) node(ctx context.Context) (string, error) {
	nodes, err := s.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing nodes: %w", err)
	}
	if len(nodes.Items) == 0 {
		return "", fmt.Errorf("the cluster has no node")
	}
	return nodes.Items[0].Name, nil
}

// bindHeld binds the Pending pods of the hold scheduler in ns to node,
// once there is one (the holder's rollout may not have created its pod
// yet): the holder's --wait then ends.
func (s *suite) bindHeld(ctx context.Context, ns, node string) error {
	var held []corev1.Pod
	if err := waitFor(ctx, "the holder's pod", 2*time.Minute, 20*time.Millisecond, func() (bool, error) {
		pods, err := s.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		held = held[:0]
		for _, p := range pods.Items {
			if p.Spec.SchedulerName == holdScheduler && p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
				held = append(held, p)
			}
		}
		return len(held) > 0, nil
	}); err != nil {
		return err
	}
	for _, p := range held {
		err := s.cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("binding pod %s/%s: %w", ns, p.Name, err)
		}
	}
	return nil
}

func (s *suite) handoffReport(r *handoffResult) (section, error) {
	var rows [][]string
	var gaps, exitGaps []float64
	for _, h := range r.handoffs {
		gaps = append(gaps, h.gap())
		exitGaps = append(exitGaps, h.exitGap())
		rows = append(rows, []string{
			strconv.Itoa(h.n), h.released.UTC().Format(time.RFC3339Nano), h.exited.UTC().Format(time.RFC3339Nano),
			h.took.UTC().Format(time.RFC3339Nano), sec3(h.gap()), sec3(h.exitGap()), strconv.Itoa(h.waiterRequests),
		})
	}
	if err := s.writeCSV("handoff.csv", []string{"handoff", "holder_released", "holder_exited", "waiter_took", "gap_s", "gap_from_exit_s", "waiter_writes_while_queued"}, rows); err != nil {
		return section{}, err
	}
	if err := s.handoffPlot(gaps, exitGaps); err != nil {
		return section{}, err
	}
	p50, p99 := percentile(gaps, 0.5), percentile(gaps, 0.99)
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("### Handoff to a waiter\n\n")
	p("A chain of %d `upgrade --wait --lock-timeout 10m` of one release (the medium chart with one Deployment), default flags otherwise: each is started once the one before holds the lock, and its pods wait for a scheduler that does not exist. ", len(r.handoffs)+1)
	p("Once the next client is queued (it wrote its place in the queue), the bench binds the holder's pods to the node itself; the holder's --wait ends, it succeeds and releases the lock, and the waiter takes it. ")
	p("The times are those of the counting proxy, which every client of the chain goes through (two tags, taken in turn), in the bench's clock: the release is the answer to the holder's last write before the take, the take is the waiter's first write of the release's records (its lock on the newest record). ")
	p("The holder's exit, a little after its release, is in the CSV too.\n\n")
	p("%s\n", table([]string{"handoffs", "gap p50", "gap p99", "max", "goal", "from the holder's exit: p50 / p99"}, [][]string{{
		strconv.Itoa(len(gaps)), secs(p50), secs(p99), secs(maxOf(gaps)),
		fmt.Sprintf("p50 at most 0.2 s: %s; p99 at most 1 s: %s", verdict(p50 <= 0.2), verdict(p99 <= 1)),
		fmt.Sprintf("%s / %s", secs(percentile(exitGaps, 0.5)), secs(percentile(exitGaps, 0.99))),
	}}))
	p("History afterwards: %s.\n\n", compactHistory(r.history))
	p("%s\n", s.image("Gap between a holder's release and the waiter's take", "handoff.png"))
	p("%s", s.footer("handoff", []string{fmt.Sprintf("--handoffs=%d", s.o.handoffs)}, "handoff.csv"))
	return section{markdown: b.String(), summary: fmt.Sprintf("  %d handoffs: gap p50 %s, p99 %s, max %s", len(gaps), secs(p50), secs(p99), secs(maxOf(gaps)))}, nil
}

// compactHistory shortens a long history to its ends.
func compactHistory(h string) string {
	f := strings.Fields(h)
	if len(f) <= 6 {
		return "`" + h + "`"
	}
	return fmt.Sprintf("`%s ... %s` (%d revisions kept)", strings.Join(f[:2], " "), strings.Join(f[len(f)-2:], " "), len(f))
}

// handoffPlot is the distribution of the gaps (sorted: a cumulative
// distribution), with the goals.
func (s *suite) handoffPlot(gaps, exitGaps []float64) error {
	p := s.newPlot("Handoff: the holder's release (or exit) to the waiter's take", "seconds", "fraction of handoffs")
	if err := addCDFs(p, [][]float64{gaps, exitGaps}, []string{"release to take", "exit to take"}); err != nil {
		return err
	}
	for i, g := range []struct{ x, y float64 }{{0.2, 0.5}, {1, 0.99}} {
		l, err := hline(0, g.x, g.y, colGoal, true)
		if err != nil {
			return err
		}
		v, err := vline(g.x, 0, g.y, colGoal, true)
		if err != nil {
			return err
		}
		p.Add(l, v)
		if i == 0 {
			p.Legend.Add("goals: p50 0.2 s, p99 1 s", l)
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Left, p.Legend.Top = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(5), vg.Points(5)
	return s.savePlot(p, "handoff.png", 18*vg.Centimeter, 12*vg.Centimeter)
}
