package guard

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

func validOptions() Options {
	return Options{
		LockBackend:        "lease",
		LeaseDuration:      15 * time.Second,
		Autorecover:        true,
		RecoverLegacyAfter: 15 * time.Minute,
		RecoverStrategy:    "fail",
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*Options)
		want   string
	}{
		"defaults":           {func(*Options) {}, ""},
		"rollback strategy":  {func(o *Options) { o.RecoverStrategy = "rollback" }, ""},
		"legacy never":       {func(o *Options) { o.RecoverLegacyAfter = 0 }, ""},
		"unknown backend":    {func(o *Options) { o.LockBackend = "etcd" }, `--lock-backend="etcd": must be auto, lease or release`},
		"short lease":        {func(o *Options) { o.LeaseDuration = 2 * time.Second }, "--lease-duration=2s: must be at least 3s (renewals happen every third of it, with a 1s safety margin)"},
		"long lease":         {func(o *Options) { o.LeaseDuration = 100 * time.Hour }, "--lease-duration=100h0m0s: must be at most 10m0s: a holder that dies keeps the release locked for one lease (renewals keep a live holder's lock however long it works)"},
		"negative wait":      {func(o *Options) { o.LockTimeout = -time.Second }, "--lock-timeout=-1s: must not be negative"},
		"negative max hold":  {func(o *Options) { o.LockMaxHold = -time.Second }, "--lock-max-hold=-1s: must not be negative"},
		"negative legacy":    {func(o *Options) { o.RecoverLegacyAfter = -time.Second }, "--recover-legacy-after=-1s: must not be negative (0 means never)"},
		"unknown strategy":   {func(o *Options) { o.RecoverStrategy = "delete" }, `--recover-strategy="delete": must be fail or rollback`},
		"empty strategy bad": {func(o *Options) { o.RecoverStrategy = "" }, `--recover-strategy="": must be fail or rollback`},
	} {
		t.Run(name, func(t *testing.T) {
			o := validOptions()
			tc.mutate(&o)
			err := o.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("Validate() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDefaultMaxHold(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{
		0:                time.Minute,
		10 * time.Second: 110 * time.Second,
		5 * time.Minute:  26 * time.Minute,
	} {
		if got := DefaultMaxHold(timeout); got != want {
			t.Errorf("DefaultMaxHold(%s) = %s, want %s", timeout, got, want)
		}
	}
}

func TestAddFlagsReadsEnvironment(t *testing.T) {
	t.Setenv(EnvLeaseDuration, "4s")
	t.Setenv(EnvAutorecover, "false")
	t.Setenv(EnvRecoverStrategy, "rollback")
	var o Options
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	if err := o.AddFlags(fs); err != nil {
		t.Fatal(err)
	}
	if o.LeaseDuration != 4*time.Second || o.Autorecover || o.RecoverStrategy != "rollback" || o.RecoverLegacyAfter != DefaultRecoverLegacyAfter {
		t.Fatalf("options from environment = %+v", o)
	}
	// A flag still wins over the environment.
	if err := fs.Parse([]string{"--lease-duration=9s", "--autorecover=true"}); err != nil {
		t.Fatal(err)
	}
	if o.LeaseDuration != 9*time.Second || !o.Autorecover {
		t.Fatalf("flags did not override the environment: %+v", o)
	}
}

func TestBadEnvironmentFailsOnlyWhereUsed(t *testing.T) {
	t.Setenv(EnvLockTimeout, "soon")
	t.Setenv(EnvAutorecover, "maybe")
	var o Options
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	if err := o.AddFlags(fs); err != nil {
		t.Fatalf("AddFlags failed on a bad variable: %v", err)
	}
	want := `HELM_AUTORECOVER_AUTORECOVER="maybe" is not true or false; HELM_AUTORECOVER_LOCK_TIMEOUT="soon" is not a duration (for example 30s, 5m or 1h30m): fix or unset it, or give the flag`
	if err := o.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate error = %v, want %q", err, want)
	}
	if err := o.EnvError("recover-delete-data", "lease-duration"); err != nil {
		t.Errorf("a command using neither variable fails: %v", err)
	}
	if err := o.EnvError("lock-timeout"); err == nil || !strings.HasPrefix(err.Error(), `HELM_AUTORECOVER_LOCK_TIMEOUT="soon" is not a duration`) {
		t.Errorf("EnvError(lock-timeout) = %v", err)
	}
	// A flag given on the command line overrides its variable.
	if err := fs.Parse([]string{"--lock-timeout=5s", "--autorecover=true"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("Validate with both flags given: %v", err)
	}
}

// TestDefaultRecoverLegacyAfter: a revision stock helm left pending is not
// presumed abandoned sooner than this tool's own holder, with helm's
// default --timeout of 5m, would give up on its own (--lock-max-hold:
// 26m), nor sooner than twelve such timeouts (issue 31: helm applies its
// timeout to each hook and each wait). The library's default is the CLI's.
func TestDefaultRecoverLegacyAfter(t *testing.T) {
	const helmTimeout = 5 * time.Minute
	maxHold := maxHoldFactor*helmTimeout + maxHoldSlack
	if DefaultRecoverLegacyAfter < 2*maxHold || DefaultRecoverLegacyAfter < 12*helmTimeout {
		t.Errorf("--recover-legacy-after defaults to %s; want at least twice the default maximum hold (%s) and twelve helm timeouts", DefaultRecoverLegacyAfter, maxHold)
	}
	if autorecover.DefaultLegacyAfter != DefaultRecoverLegacyAfter {
		t.Errorf("pkg/autorecover's DefaultLegacyAfter %s differs from the CLI's %s", autorecover.DefaultLegacyAfter, DefaultRecoverLegacyAfter)
	}
}
