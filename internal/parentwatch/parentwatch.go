// Package parentwatch lets a helm-autorecover started as a helm plugin
// notice that helm, its parent process, has ended: many CI runners signal
// only the main process when they cancel a job, helm dies at once, and the
// plugin would otherwise go on upgrading and holding the release's lock.
// A guarded operation watches Gone and takes its first-signal path at once
// (release marked failed, lock released); any other command, when helm is
// gone and it still runs a short grace later, is sent SIGTERM.
//
// The watch costs no API request: on Linux it waits on a pidfd of the
// parent (one blocked thread), elsewhere it reads getppid every
// PollInterval. It never uses PR_SET_PDEATHSIG, which fires when the
// parent thread that started this process exits, and a Go parent such as
// helm can end that thread while it is alive and waiting for the plugin.
// Windows is not covered.
package parentwatch

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Variables helm sets in the environment of a plugin's command (helm v3
// and v4 alike); a process with both is a helm plugin.
const (
	EnvPluginName = "HELM_PLUGIN_NAME"
	EnvPluginDir  = "HELM_PLUGIN_DIR"
)

// Grace is how long this process may take to end by itself after its
// parent ended before it is sent SIGTERM. A signal sent to helm's whole
// process group or process tree (Ctrl-C in a terminal, timeout(1), most CI
// runners) reaches this process too, and a guarded operation then marks
// its release failed and releases the lock well within the 5 s its first
// signal allows; a SIGTERM on top of it would be a second signal, which
// ends the process at once and leaves the release pending until its lock
// expires. Grace is that bound.
const Grace = 5 * time.Second

// PollInterval is how often getppid is read where no pidfd can be waited on.
const PollInterval = 250 * time.Millisecond

var (
	once sync.Once
	// gone is closed, once (goneOnce), when the parent has ended (Gone).
	gone     = make(chan struct{})
	goneOnce sync.Once
	// claimed is set once a caller handles gone itself (Claim).
	claimed atomic.Bool
)

// Gone is closed, in plugin mode, as soon as helm, the parent process, has
// ended; outside plugin mode it never is.
func Gone() <-chan struct{} { return gone }

// Claim says the caller handles Gone itself (the guard treats it as a
// first signal at once): the process is then not sent SIGTERM after Grace.
func Claim() { claimed.Store(true) }

// Start watches the parent process when this process runs as a helm
// plugin (see EnvPluginName, EnvPluginDir) and does nothing otherwise. It
// returns at once. When the parent ends and this process still runs Grace
// later, a line on stderr says so and the process sends itself SIGTERM.
// Only the first call in a process counts.
func Start() {
	once.Do(func() {
		if runtime.GOOS == "windows" || !PluginMode(os.Getenv) {
			return
		}
		start(os.Getppid(), Grace, os.Stderr, interrupt)
	})
}

// PluginMode reports whether the environment read by getenv is that of a
// command helm runs for a plugin.
func PluginMode(getenv func(string) string) bool {
	return getenv(EnvPluginName) != "" && getenv(EnvPluginDir) != ""
}

// start watches ppid and, once it ended and grace has passed, writes a
// line to errOut and calls fire.
func start(ppid int, grace time.Duration, errOut io.Writer, fire func()) {
	Watch(ppid, func() {
		goneOnce.Do(func() { close(gone) })
		time.AfterFunc(grace, func() {
			if claimed.Load() {
				return
			}
			fmt.Fprintf(errOut, "helm-autorecover: helm (pid %d), which started this plugin, has ended; interrupting the operation (as a first SIGTERM would)\n", ppid)
			fire()
		})
	})
}

// Watch calls gone, once and from another goroutine, when the process
// ppid has ended. ppid must be this process's parent, as os.Getppid
// returned it: a parent that ended before the watch began is noticed
// because getppid then names another process. Watch returns at once; a
// ppid of 0 or 1 (no parent to outlive, or init) is not watched.
func Watch(ppid int, gone func()) {
	if ppid <= 1 {
		return
	}
	go func() {
		if err := waitExit(ppid); err != nil {
			// No pidfd (old kernel, seccomp, another system): read getppid,
			// which changes when the parent ends and this process is
			// handed to a reaper.
			pollParent(ppid, PollInterval)
		}
		gone()
	}()
}

// pollParent returns once getppid no longer returns ppid.
func pollParent(ppid int, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for os.Getppid() == ppid {
		<-t.C
	}
}

// interrupt sends this process SIGTERM.
func interrupt() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Signal(syscall.SIGTERM)
	}
}
