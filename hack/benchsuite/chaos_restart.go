package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
)

func init() { chaosScenarios["restart"] = (*suite).chaosRestart }

// restartComponents are the control-plane processes the restart group
// restarts, one at a time (the other keeps running). etcd first: after the
// API server restarts, kube-scheduler's watches were refused (RBAC not yet
// loaded) and it scheduled nothing for minutes, so a case that installs a
// fresh release after it may time out in its setup.
var restartComponents = []string{"etcd", "kube-apiserver"}

// restartScript restarts one component of the cluster whose directory is
// $LOCAL_CLUSTER_DIR (relative to the repository, where the suite runs).
var restartScript = "hack/local-cluster.sh"

// restartPoint is where the holder is held while the component goes down:
// the lock is taken and the pending revision written (see pausePoint).
const restartPoint = pausePoint

// restartCase is one restart of a component under an operation.
type restartCase struct {
	component, backend string
	reached            bool    // the holder stopped at restartPoint and was continued with the component down
	holderExit         int     // the interrupted upgrade's
	restart            float64 // seconds from stopping the component to the API server ready
	exit               int     // of the upgrade run once the server was ready
	fromReady          float64 // seconds from the server ready to that upgrade's success
	fromFree           float64 // the same from the later of ready and the holder's exit
	alone              float64 // seconds the same upgrade takes undisturbed
	lost               int
	deployed           int
	pending            int
	overlaps           int
	note               string
}

// bound is the most fromFree may be: one lease, 2 s, and the operation.
func (c restartCase) bound(lease time.Duration) float64 {
	return (lease + 2*time.Second).Seconds() + c.alone
}

// documented reports whether code is one of exitcode.Docs.
func documented(code int) bool {
	return slices.ContainsFunc(exitcode.Docs, func(d exitcode.Doc) bool { return d.Code == code })
}

func (c restartCase) ok(lease time.Duration) bool {
	return c.reached && documented(c.holderExit) && c.exit == 0 && c.lost == 0 && c.deployed == 1 && c.pending == 0 &&
		c.overlaps == 0 && c.fromFree <= c.bound(lease)
}

// chaosRestart restarts the API server (etcd kept), then etcd, in the
// middle of an upgrade: the release must not stay stuck longer than one
// lease after the server is back. It needs a cluster of its own started by
// hack/local-cluster.sh: its directory is the --kubeconfig's.
func (s *suite) chaosRestart(ctx context.Context) (*chaosResult, error) {
	kc, err := filepath.Abs(s.o.kubeconfig)
	if err != nil {
		return nil, err
	}
	clusterDir := filepath.Dir(kc)
	for _, c := range restartComponents {
		if _, err := os.Stat(filepath.Join(clusterDir, "pids", c+".pid")); err != nil {
			return nil, fmt.Errorf("the restart group restarts the cluster of hack/local-cluster.sh whose directory holds the --kubeconfig (%s): %w", kc, err)
		}
	}
	script, err := filepath.Abs(restartScript)
	if err != nil {
		return nil, err
	}
	ns, err := s.namespace(ctx, "chaos-restart")
	if err != nil {
		return nil, err
	}
	res := &chaosResult{}
	var cases []restartCase
	for _, component := range restartComponents {
		for _, backend := range s.o.chaos.backends {
			c, err := s.restartOnce(ctx, ns, script, clusterDir, component, backend)
			if err != nil {
				return res, fmt.Errorf("restart %s (%s): %w", component, backend, err)
			}
			cases = append(cases, c)
			res.cases++
			verdict := "ok"
			if !c.ok(s.o.chaos.lease) {
				res.violations++
				verdict = "VIOLATION"
			}
			res.line("restart %-14s %-7s %-9s reached=%t holder-exit=%d restart=%.2fs exit=%d ready-to-ok=%.2fs free-to-ok=%.2fs bound=%.2fs alone=%.2fs lost=%d deployed=%d pending=%d overlaps=%d %s",
				component, backend, verdict, c.reached, c.holderExit, c.restart, c.exit, c.fromReady, c.fromFree, c.bound(s.o.chaos.lease), c.alone, c.lost, c.deployed, c.pending, c.overlaps, c.note)
		}
	}
	res.markdown = s.restartReport(cases)
	return res, nil
}

// restartOnce runs one case on a release of its own: the holder is held
// after its pending write, the component is stopped, the holder continued
// while it is down, and once the server is ready again the next upgrade
// runs at once.
func (s *suite) restartOnce(ctx context.Context, ns, script, clusterDir, component, backend string) (restartCase, error) {
	c := restartCase{component: component, backend: backend, holderExit: -1, exit: -1}
	short := strings.TrimPrefix(component, "kube-")
	rel := fmt.Sprintf("rs-%s-%s", short, shortBackend(backend))
	logFile := filepath.Join(s.dir, "chaos-"+rel+".log")
	setup := "chaos-setup-" + rel
	if err := s.chaosMust(ctx, setup, s.opArgs("install", rel, ns, backend, true)); err != nil {
		return c, err
	}
	// The operation's own duration, undisturbed.
	alone, err := s.runAs(ctx, setup, nil, s.opArgs("upgrade", rel, ns, backend, true)...)
	if err != nil {
		return c, err
	}
	if err := alone.err(); err != nil {
		return c, err
	}
	c.alone = alone.elapsed().Seconds()

	holder, err := s.startAs(ctx, "chaos-holder-"+rel, append(chaosEnv("", logFile), "HELM_AUTORECOVER_CHAOS_STOP_AT="+restartPoint), s.opArgs("upgrade", rel, ns, backend, false)...)
	if err != nil {
		return c, err
	}
	defer holder.kill() // a no-op once it has exited
	if err := waitStopped(ctx, holder); err != nil {
		c.note = fmt.Sprintf("point %s not reached: %v: %s", restartPoint, err, tail(holder.stderr.String(), 300))
		return c, nil
	}
	if c.note, err = s.pendingNote(ctx, ns, rel); err != nil || c.note != "" {
		return c, err
	}
	pidFile := filepath.Join(clusterDir, "pids", component+".pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return c, err
	}
	oldPID, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return c, fmt.Errorf("%s: %w", pidFile, err)
	}
	var out syncBuffer
	restart := exec.CommandContext(ctx, script, "restart", component)
	restart.Env = append(os.Environ(), "LOCAL_CLUSTER_DIR="+clusterDir)
	restart.Stdout, restart.Stderr = &out, &out
	began := time.Now()
	if err := restart.Start(); err != nil {
		return c, fmt.Errorf("%s restart %s: %w", script, component, err)
	}
	restarted := make(chan error, 1)
	go func() { restarted <- restart.Wait() }()
	// The holder goes on once the component is down (gone, or a zombie).
	if err := waitFor(ctx, component+" to stop", time.Minute, 10*time.Millisecond, func() (bool, error) {
		st, err := procState(oldPID)
		return err != nil || st == 'Z', nil
	}); err != nil {
		return c, err
	}
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return c, fmt.Errorf("continuing the holder: %w", err)
	}
	c.reached = true
	if err := <-restarted; err != nil {
		return c, fmt.Errorf("%s restart %s: %w: %s", script, component, err, tail(out.String(), 800))
	}
	ready := time.Now()
	c.restart = ready.Sub(began).Seconds()
	next, err := s.runAs(ctx, "chaos-next-"+rel, chaosEnv("", logFile), s.opArgs("upgrade", rel, ns, backend, true)...)
	if err != nil {
		return c, err
	}
	c.exit = next.exit
	if next.exit != 0 {
		c.note += " next: " + tail(next.stderr.String(), 300)
	}
	select {
	case <-holder.done:
	case <-time.After(3 * time.Minute):
		holder.kill()
		<-holder.done
		c.note += " holder still running 3m after the server was ready (killed);"
	}
	c.holderExit = holder.exit
	if holder.exit != 0 {
		c.note += fmt.Sprintf(" holder exit %d: %s", holder.exit, errorLine(holder.stderr.String()))
	}
	c.fromReady = next.end.Sub(ready).Seconds()
	// A holder still live after the server came back holds the release
	// rightfully (it renews): the release is free from its exit on.
	free := ready
	if holder.end.After(free) && holder.end.Before(next.end) {
		free = holder.end
	}
	c.fromFree = next.end.Sub(free).Seconds()
	rc, err := s.checkRelease(ctx, ns, rel)
	if err != nil {
		return c, err
	}
	c.lost, c.deployed, c.pending, c.overlaps = rc.lost, rc.deployed, rc.pending, rc.overlaps
	return c, nil
}

// restartReport is the restart group's section.
func (s *suite) restartReport(cases []restartCase) string {
	var b strings.Builder
	lease := s.o.chaos.lease
	b.WriteString("### Control-plane restart\n\n")
	fmt.Fprintf(&b, "A holder runs `upgrade --wait` (chart `%s`, `--lease-duration %s`) and is held (SIGSTOP) at `%s`, its lock taken and its pending revision written (checked). "+
		"Then `hack/local-cluster.sh restart COMPONENT` stops the API server (etcd kept), or etcd (the API server kept), by its recorded PID and starts it again with the same flags and ports (chosen below the kernel's ephemeral range, so that no client's connection takes one meanwhile; the script still waits until each is free); the holder is continued (SIGCONT) as soon as the old process is gone, so it goes on against a control plane that is down. "+
		"It must finish or fail with a documented exit code. As soon as the API server is ready again the same upgrade runs with `--lock-timeout 2m`: it must succeed, with the history gap-free, one `deployed` revision, nothing pending, and no two clients' write spans overlapping in the audit log. "+
		"The goal: the release is stuck (pending or locked) no longer than one lease after the server is back: from the later of \"server ready\" and the holder's exit (a holder still live then holds the release rightfully) to the next upgrade's success is at most lease + 2 s + the same upgrade's own duration measured alone just before; a case over it is a violation. "+
		"etcd restarts first: after an API server restart kube-scheduler's watches were refused for a while (RBAC not yet loaded) and it scheduled nothing for minutes, which only delays a fresh install's setup (the cases' own upgrades change a ConfigMap, no pod). The group restarts the cluster it is given (the kubeconfig's folder, one of `hack/local-cluster.sh`); where others share that cluster, give the group one of its own: `LOCAL_CLUSTER_DIR=/tmp/rs-cluster make chaos CHAOS_FLAGS=--scenarios=restart` (make hands over `$LOCAL_CLUSTER_DIR/kubeconfig`, and the suite reads the audit log beside it).\n\n",
		filepath.ToSlash(s.o.chaos.chart), lease, restartPoint)
	var rows [][]string
	for _, c := range cases {
		verdict := "ok"
		if !c.ok(lease) {
			verdict = "**failed**"
		}
		rows = append(rows, []string{
			c.component, c.backend, verdict, strconv.Itoa(c.holderExit), fmt.Sprintf("%.1f s", c.restart), strconv.Itoa(c.exit),
			fmt.Sprintf("%.2f s", c.fromReady), fmt.Sprintf("%.2f s", c.fromFree), fmt.Sprintf("%.2f s (%s + 2 s + %.2f s)", c.bound(lease), lease, c.alone),
			strconv.Itoa(c.deployed), strconv.Itoa(c.pending), strconv.Itoa(c.overlaps),
		})
	}
	b.WriteString(table([]string{"restarted", "backend", "verdict", "holder exit", "stop to ready", "next exit", "ready to success", "free to success", "goal: at most", "deployed (goal 1)", "pending (goal 0)", "overlaps (goal 0)"}, rows))
	var failed []string
	for _, c := range cases {
		if !c.ok(lease) {
			failed = append(failed, fmt.Sprintf("- %s (%s): %s", c.component, c.backend, strings.TrimSpace(c.note)))
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nCases that failed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + s.chaosFooter("restart", "--chaos-lease="+lease.String()))
	return b.String()
}
