package guard

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestPreemptWait: a client that asks to preempt waits for the lock up to
// --lock-timeout when it is set, else up to the operation's --timeout
// (the holder's own operation would end by then), else helm's default 5m.
func TestPreemptWait(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		lockTimeout, timeout time.Duration
		want                 time.Duration
	}{
		{"--lock-timeout wins", 2 * time.Minute, 10 * time.Minute, 2 * time.Minute},
		{"--lock-timeout alone", 30 * time.Second, 0, 30 * time.Second},
		{"--timeout when --lock-timeout is 0", 0, 10 * time.Minute, 10 * time.Minute},
		{"neither: helm's default", 0, 0, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{LockTimeout: tc.lockTimeout}
			if got := o.PreemptWait(tc.timeout); got != tc.want {
				t.Errorf("PreemptWait(%s) with --lock-timeout %s = %s; want %s", tc.timeout, tc.lockTimeout, got, tc.want)
			}
		})
	}
}

// TestPreemptFlag: --preempt defaults to HELM_AUTORECOVER_PREEMPT (any
// spelling strconv.ParseBool reads), the flag wins over it, and a value
// that does not parse fails the command through EnvError, as the other
// variables do, unless the flag is given.
func TestPreemptFlag(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		want      bool
		err       string
	}{
		{"unset", "", nil, false, ""},
		{"variable true", "true", nil, true, ""},
		{"variable 1", "1", nil, true, ""},
		{"variable false", "false", nil, false, ""},
		{"flag", "", []string{"--preempt"}, true, ""},
		{"flag over the variable", "true", []string{"--preempt=false"}, false, ""},
		{"bad variable", "soon", nil, false, `HELM_AUTORECOVER_PREEMPT="soon" is not true or false: fix or unset it, or give the flag`},
		{"bad variable, flag given", "soon", []string{"--preempt"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvPreempt, tc.env)
			var o Options
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			if err := o.AddFlags(fs); err != nil {
				t.Fatal(err)
			}
			o.AddPreemptFlag(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if o.Preempt != tc.want {
				t.Errorf("Preempt = %v; want %v", o.Preempt, tc.want)
			}
			got := ""
			if err := o.EnvError(); err != nil {
				got = err.Error()
			}
			if got != tc.err {
				t.Errorf("EnvError() = %q; want %q", got, tc.err)
			}
			if err := o.EnvError("lock-timeout"); err != nil {
				t.Errorf("EnvError(lock-timeout) = %v; the variable is --preempt's alone", err)
			}
		})
	}
}
