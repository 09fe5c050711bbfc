package main

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// machineInfo is where the figures were measured, and with what.
type machineInfo struct {
	cores   int
	cpu     string
	memMiB  int64
	kernel  string
	kube    string // the API server's version
	ours    string // helm-autorecover: git describe of the checkout
	oursBin string // what the binary says of itself
	stock   string // stock helm's version
	goVer   string // the Go that built helm-autorecover
}

func readMachine(ctx context.Context, cs kubernetes.Interface, o options) machineInfo {
	m := machineInfo{cores: runtime.NumCPU(), cpu: "unknown CPU", kernel: "unknown kernel"}
	if v := procField("/proc/cpuinfo", "model name", ":"); v != "" {
		m.cpu = v
	}
	if v := procField("/proc/meminfo", "MemTotal", ":"); v != "" {
		kib, _ := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
		m.memMiB = kib / 1024
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	m.kube = "unknown"
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		m.kube = v.GitVersion
	}
	m.ours = output(ctx, "", "git", "describe", "--tags", "--always", "--dirty")
	m.oursBin = firstLine(output(ctx, "", o.bin, "version"))
	m.stock = output(ctx, "", o.helm, "version", "--short")
	m.goVer = "unknown"
	if bi, err := buildinfo.ReadFile(o.bin); err == nil {
		m.goVer = bi.GoVersion
	}
	return m
}

// procField reads the first "key<sep> value" line of a /proc file.
func procField(path, key, sep string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, sep); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// output runs a command and returns its trimmed output, or "unknown".
func output(ctx context.Context, dir, name string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil || len(strings.TrimSpace(string(out))) == 0 {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// short is the plots' subtitle: the cores and the builds compared, no more
// (the document's caption has the rest).
func (m machineInfo) short() string {
	return fmt.Sprintf("%d cores; helm-autorecover %s, stock helm %s", m.cores, m.ours, m.stock)
}

// hardware is the machine in a few words.
func (m machineInfo) hardware() string {
	return fmt.Sprintf("%d cores (%s), %.1f GiB memory, %s", m.cores, m.cpu, float64(m.memMiB)/1024, m.kernel)
}

// versions are the versions of what was measured.
func (m machineInfo) versions() string {
	ours := m.ours
	if !strings.Contains(m.oursBin, m.ours) {
		// A binary built from another state of the checkout.
		ours += " (the binary says: " + m.oursBin + ")"
	}
	return fmt.Sprintf("helm-autorecover %s, stock helm %s, Kubernetes %s, %s", ours, m.stock, m.kube, m.goVer)
}

func (m machineInfo) summary() string { return m.hardware() + "; " + m.versions() }
