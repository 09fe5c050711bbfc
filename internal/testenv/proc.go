package testenv

import (
	"bytes"
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a process started by Env.Start.
type Proc struct {
	Cmd            *exec.Cmd
	Stdout, Stderr lockedBuffer
}

// Kill sends SIGKILL to the process for real and reaps it.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL pid %d: %v", p.Cmd.Process.Pid, err)
	}
	_ = p.Cmd.Wait()
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to pid %d: %v", sig, p.Cmd.Process.Pid, err)
	}
}

// Wait waits at most timeout for the process to exit and returns its exit
// code; it fails the test on timeout.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Cmd.Wait() }()
	select {
	case err := <-done:
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode()
		}
		if err != nil {
			t.Fatalf("waiting for pid %d: %v", p.Cmd.Process.Pid, err)
		}
		return 0
	case <-time.After(timeout):
		_ = p.Cmd.Process.Kill()
		t.Fatalf("pid %d did not exit within %s\nstdout:\n%s\nstderr:\n%s", p.Cmd.Process.Pid, timeout, p.Stdout.String(), p.Stderr.String())
		return -1
	}
}

// lockedBuffer is a bytes.Buffer safe to write from the exec copier while a
// test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
