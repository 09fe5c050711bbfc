package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// logLine is one JSON log line of the controller.
type logLine struct {
	At        time.Time // its own time field (else when read)
	Level     string
	Msg       string
	Release   string
	Namespace string
	Raw       string
}

// rssSample is one reading of /proc/PID/status.
type rssSample struct {
	At         time.Time
	Phase      string
	RSS, Peak  int64 // VmRSS and VmHWM, KiB
	Anon, File int64 // RssAnon and RssFile (the binary's mapped pages), KiB
	Heap, Goro float64
}

// ctrlProc is the controller run as a local process.
type ctrlProc struct {
	cmd     *exec.Cmd
	start   time.Time
	metrics string // http://127.0.0.1:PORT/metrics
	readyz  string
	logFile *os.File

	mu      sync.Mutex
	lines   []logLine
	samples []rssSample
	phase   string
	exited  chan struct{}
	waitErr error
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startController starts bin's controller with the kubeconfig given,
// logging to logPath, and samples its memory every second.
func startController(bin, kubeconfig, logPath string, env, extra []string) (*ctrlProc, error) {
	mp, err := freePort()
	if err != nil {
		return nil, err
	}
	hp, err := freePort()
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"controller",
		"--leader-elect=false",
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(mp),
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(hp),
		"--log-level", "info",
	}, extra...)
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig), env...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = f
	c := &ctrlProc{
		cmd: cmd, logFile: f, phase: "startup", exited: make(chan struct{}),
		metrics: "http://127.0.0.1:" + strconv.Itoa(mp) + "/metrics",
		readyz:  "http://127.0.0.1:" + strconv.Itoa(hp) + "/readyz",
	}
	fmt.Fprintf(os.Stderr, "$ KUBECONFIG=%s %s %s %s\n", kubeconfig, strings.Join(env, " "), bin, strings.Join(args, " "))
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	read := make(chan struct{})
	go func() {
		c.readLog(pr)
		close(read)
	}()
	go func() {
		c.waitErr = cmd.Wait()
		_ = pw.Close()
		<-read
		close(c.exited)
	}()
	go c.sample()
	return c, nil
}

func (c *ctrlProc) readLog(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		raw := sc.Text()
		now := time.Now()
		_, _ = fmt.Fprintln(c.logFile, raw)
		var m map[string]any
		l := logLine{At: now, Raw: raw}
		if json.Unmarshal([]byte(raw), &m) == nil {
			if s, ok := m["time"].(string); ok {
				if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
					l.At = t
				}
			}
			l.Level, _ = m["level"].(string)
			l.Msg, _ = m["msg"].(string)
			l.Release, _ = m["release"].(string)
			l.Namespace, _ = m["namespace"].(string)
		}
		c.mu.Lock()
		c.lines = append(c.lines, l)
		c.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r) // never block the controller on its stderr
}

// logLines returns the lines logged so far.
func (c *ctrlProc) logLines() []logLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]logLine(nil), c.lines...)
}

// firstLog returns the first line whose message is msg, if any.
func (c *ctrlProc) firstLog(msg string) (logLine, bool) {
	for _, l := range c.logLines() {
		if l.Msg == msg {
			return l, true
		}
	}
	return logLine{}, false
}

func (c *ctrlProc) setPhase(p string) {
	c.mu.Lock()
	c.phase = p
	c.mu.Unlock()
}

// sample reads VmRSS and VmHWM of the process every second, and every
// 15 s (as often as Prometheus would scrape it) the Go heap and goroutines
// from its metrics.
func (c *ctrlProc) sample() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		st, err := procStatus(c.cmd.Process.Pid)
		if err == nil {
			s := rssSample{At: time.Now(), RSS: st.rss, Peak: st.hwm, Anon: st.anon, File: st.file}
			if i%15 == 14 {
				m, _ := scrape(c.metrics)
				s.Heap = m.sum("go_memstats_heap_inuse_bytes", nil)
				s.Goro = m.sum("go_goroutines", nil)
			}
			c.mu.Lock()
			s.Phase = c.phase
			c.samples = append(c.samples, s)
			c.mu.Unlock()
		}
		select {
		case <-c.exited:
			return
		case <-t.C:
		}
	}
}

func (c *ctrlProc) rssSamples() []rssSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rssSample(nil), c.samples...)
}

// memStatus is what /proc/PID/status says of a process's memory, in KiB.
type memStatus struct{ rss, hwm, anon, file int64 }

// procStatus reads VmRSS, VmHWM, RssAnon and RssFile of pid.
func procStatus(pid int) (memStatus, error) {
	var m memStatus
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = v
		case "VmHWM:":
			m.hwm = v
		case "RssAnon:":
			m.anon = v
		case "RssFile:":
			m.file = v
		}
	}
	if m.rss == 0 {
		return m, fmt.Errorf("pid %d: no VmRSS", pid)
	}
	return m, nil
}

// waitReady polls /readyz until it answers 200 and returns when it did.
func (c *ctrlProc) waitReady(limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		res, err := http.Get(c.readyz)
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		select {
		case <-c.exited:
			return time.Time{}, fmt.Errorf("the controller exited: %w", c.waitErr)
		default:
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("/readyz not 200 within %s", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM, then SIGKILL after 15 s, and waits for the process.
func (c *ctrlProc) stop() {
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	_ = c.logFile.Close()
}
