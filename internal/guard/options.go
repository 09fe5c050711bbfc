package guard

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Options are the lock and recovery flags of the four mutating commands.
// Each flag defaults to its HELM_AUTORECOVER_* environment variable.
type Options struct {
	LockBackend        string
	LeaseDuration      time.Duration
	LockTimeout        time.Duration
	LockMaxHold        time.Duration
	Autorecover        bool
	RecoverLegacyAfter time.Duration
	RecoverStrategy    string
	// RecoverDeleteData lets recovery delete PersistentVolumeClaims,
	// CustomResourceDefinitions and Namespaces that only an abandoned
	// revision created (--recover-delete-data).
	RecoverDeleteData bool
	// Preempt asks a live holder of the lock to stop (--preempt), then
	// waits in arrival order; see AddPreemptFlag.
	Preempt bool

	// fs and envErrs are the flag set AddFlags registered the options on
	// and the variables that did not parse, by flag name (EnvError).
	fs      *pflag.FlagSet
	envErrs map[string]error
}

// Environment variables behind the flags.
const (
	EnvLockBackend        = "HELM_AUTORECOVER_LOCK_BACKEND"
	EnvLeaseDuration      = "HELM_AUTORECOVER_LEASE_DURATION"
	EnvLockTimeout        = "HELM_AUTORECOVER_LOCK_TIMEOUT"
	EnvLockMaxHold        = "HELM_AUTORECOVER_LOCK_MAX_HOLD"
	EnvAutorecover        = "HELM_AUTORECOVER_AUTORECOVER"
	EnvRecoverLegacyAfter = "HELM_AUTORECOVER_RECOVER_LEGACY_AFTER"
	EnvRecoverStrategy    = "HELM_AUTORECOVER_RECOVER_STRATEGY"
	EnvRecoverDeleteData  = "HELM_AUTORECOVER_RECOVER_DELETE_DATA"
	EnvPreempt            = "HELM_AUTORECOVER_PREEMPT"
)

// Defaults.
const (
	DefaultLockBackend = protocol.BackendAuto
	// DefaultRecoverLegacyAfter is an hour: helm applies --timeout to each
	// hook and each wait, so one stock helm operation can last several
	// timeouts (docs/protocol.md, "Why an hour"); an hour is twelve of
	// helm's default 5m, and more than twice this tool's own default
	// maximum hold (26m).
	DefaultRecoverLegacyAfter = time.Hour
	// maxHoldFactor and maxHoldSlack give the default --lock-max-hold:
	// 5 x --timeout + 1m. Helm applies --timeout per hook and per wait, so an
	// upgrade with pre- and post-hooks and --wait can legitimately last about
	// three timeouts; five leaves room, and the minute covers chart loading
	// and rendering.
	maxHoldFactor = 5
	maxHoldSlack  = time.Minute
)

// DefaultMaxHold is the --lock-max-hold used when the flag is not set.
func DefaultMaxHold(timeout time.Duration) time.Duration {
	return maxHoldFactor*timeout + maxHoldSlack
}

// AddFlags registers the options on fs, with defaults from the environment.
// It does not fail: a variable that does not parse leaves the flag's
// default and is reported by Validate (or EnvError), so that only a
// command that uses it fails, and not when its flag is given. (The error
// result is always nil.)
func (o *Options) AddFlags(fs *pflag.FlagSet) error {
	o.fs = fs
	o.envErrs = map[string]error{}
	dur := func(flag, env string, def time.Duration) time.Duration {
		d, err := DurationEnv(env, def)
		if err != nil {
			o.envErrs[flag] = err
		}
		return d
	}
	str := func(env, def string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return def
	}
	boolean := func(flag, env string, def bool) bool {
		v := os.Getenv(env)
		if v == "" {
			return def
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			o.envErrs[flag] = fmt.Errorf("%s=%q is not true or false", env, v)
			return def
		}
		return b
	}
	autorecover := boolean("autorecover", EnvAutorecover, true)
	deleteData := boolean("recover-delete-data", EnvRecoverDeleteData, false)
	LockBackendFlag(fs, &o.LockBackend)
	fs.DurationVar(&o.LeaseDuration, "lease-duration", dur("lease-duration", EnvLeaseDuration, protocol.DefaultLeaseDuration),
		"how long the lock stays valid without renewal, 3s to 10m; it is renewed every third of it, and a holder that dies keeps the release locked this long ["+EnvLeaseDuration+"]")
	fs.DurationVar(&o.LockTimeout, "lock-timeout", dur("lock-timeout", EnvLockTimeout, 0),
		"wait up to this long, in arrival order, for a lock another client holds (0: fail at once) ["+EnvLockTimeout+"]")
	fs.DurationVar(&o.LockMaxHold, "lock-max-hold", dur("lock-max-hold", EnvLockMaxHold, 0),
		"abort the operation and give the lock up after holding it this long (0: 5 x --timeout + 1m) ["+EnvLockMaxHold+"]")
	fs.BoolVar(&o.Autorecover, "autorecover", autorecover,
		"recover a release left pending under an expired lock before running ["+EnvAutorecover+"]")
	fs.DurationVar(&o.RecoverLegacyAfter, "recover-legacy-after", dur("recover-legacy-after", EnvRecoverLegacyAfter, DefaultRecoverLegacyAfter),
		"recover a release left pending with no lock record (stock helm) once it has been pending this long in server time (0: never) ["+EnvRecoverLegacyAfter+"]")
	fs.StringVar(&o.RecoverStrategy, "recover-strategy", str(EnvRecoverStrategy, string(recovery.StrategyFail)),
		"after marking an abandoned revision failed: fail (just run the operation) or rollback (first roll back to the last deployed revision) ["+EnvRecoverStrategy+"]")
	fs.Lookup("recover-strategy").Annotations = map[string][]string{usageWithoutOperation: {
		"after marking an abandoned revision failed: fail (no more: the release stays at its last deployed state) or rollback (then roll back to the last deployed revision, a new revision) [" + EnvRecoverStrategy + "]",
	}}
	fs.BoolVar(&o.RecoverDeleteData, "recover-delete-data", deleteData,
		"let recovery delete PersistentVolumeClaims, CustomResourceDefinitions and Namespaces that only an abandoned revision created and the revision written next does not render (deleting one destroys a volume's data, every custom resource of the kind, everything in the namespace); without it they are kept and reported ["+EnvRecoverDeleteData+"]")
	return nil
}

// AddPreemptFlag registers --preempt, on the guarded commands only
// (recover, unlock and the controller never preempt), with its default
// from the environment; a variable that does not parse is reported as
// AddFlags' are. Call it after AddFlags.
func (o *Options) AddPreemptFlag(fs *pflag.FlagSet) {
	def := false
	if v := os.Getenv(EnvPreempt); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			o.envErrs["preempt"] = fmt.Errorf("%s=%q is not true or false", EnvPreempt, v)
		} else {
			def = b
		}
	}
	fs.BoolVar(&o.Preempt, "preempt", def,
		"ask a live holder of the release's lock to stop (its install or upgrade ends failed, as on Ctrl-C), then wait in arrival order up to --lock-timeout, or --timeout when --lock-timeout is 0; a holder that cannot stop safely (a rollback, an uninstall, a hook running) finishes first ["+EnvPreempt+"]")
}

// PreemptWait is how long a client that asked to preempt waits for the
// lock: --lock-timeout when set, otherwise the operation's --timeout (5m
// when it has none).
func (o *Options) PreemptWait(timeout time.Duration) time.Duration {
	switch {
	case o.LockTimeout > 0:
		return o.LockTimeout
	case timeout > 0:
		return timeout
	}
	return 5 * time.Minute
}

// EnvAdvice ends the error about a variable that does not parse.
const EnvAdvice = "fix or unset it, or give the flag"

// DurationEnv reads a duration from the variable env; def when it is unset
// or empty, and def with an error in plain words when it does not parse.
func DurationEnv(env string, def time.Duration) (time.Duration, error) {
	v, ok := os.LookupEnv(env)
	if !ok || v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return def, fmt.Errorf("%s=%q is not a duration (for example 30s, 5m or 1h30m)", env, v)
	}
	return d, nil
}

// EnvError reports the HELM_AUTORECOVER_* variables behind the named flags
// (every flag when none is named) that do not parse, unless the flag was
// given on the command line, in one sentence.
func (o *Options) EnvError(flags ...string) error {
	if len(flags) == 0 {
		for f := range o.envErrs {
			flags = append(flags, f)
		}
		slices.Sort(flags)
	}
	var msgs []string
	for _, f := range flags {
		err, ok := o.envErrs[f]
		if !ok || (o.fs != nil && o.fs.Changed(f)) {
			continue
		}
		msgs = append(msgs, err.Error())
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", strings.Join(msgs, "; "), EnvAdvice)
}

// LockBackendFlag registers --lock-backend on fs, defaulting to
// HELM_AUTORECOVER_LOCK_BACKEND: the guarded commands and the lock commands
// share it. ValidateLockBackend checks the value when the command runs.
func LockBackendFlag(fs *pflag.FlagSet, v *string) {
	def := os.Getenv(EnvLockBackend)
	if def == "" {
		def = DefaultLockBackend
	}
	fs.StringVar(v, "lock-backend", def,
		"where the release lock lives: release (on the release's newest storage record), lease (there and in a coordination.k8s.io Lease per release), or auto (lease when the caller may get, create and update Leases, release otherwise) ["+EnvLockBackend+"]")
}

// ValidateLockBackend checks a --lock-backend value; the error names the
// flag, or the variable when the value came from it.
func ValidateLockBackend(v string) error {
	switch v {
	case protocol.BackendAuto, protocol.BackendLease, protocol.BackendRelease:
		return nil
	}
	if os.Getenv(EnvLockBackend) == v {
		return fmt.Errorf("%s=%q: must be auto, lease or release", EnvLockBackend, v)
	}
	return fmt.Errorf("--lock-backend=%q: must be auto, lease or release", v)
}

// Validate checks the options; the error names the flag, or the variable a
// value came from.
func (o *Options) Validate() error { return o.ValidateFlags() }

// ValidateFlags checks the options of a command that has only the named
// flags (all of them when none is named): the variables of the others are
// not its concern.
func (o *Options) ValidateFlags(flags ...string) error {
	if err := o.EnvError(flags...); err != nil {
		return err
	}
	if err := ValidateLockBackend(o.LockBackend); err != nil {
		return err
	}
	if o.LeaseDuration < 3*time.Second {
		return fmt.Errorf("--lease-duration=%s: must be at least 3s (renewals happen every third of it, with a 1s safety margin)", o.LeaseDuration)
	}
	if o.LeaseDuration > protocol.MaxLeaseDuration {
		return fmt.Errorf("--lease-duration=%s: must be at most %s: a holder that dies keeps the release locked for one lease (renewals keep a live holder's lock however long it works)", o.LeaseDuration, protocol.MaxLeaseDuration)
	}
	if o.LockTimeout < 0 {
		return fmt.Errorf("--lock-timeout=%s: must not be negative", o.LockTimeout)
	}
	if o.LockMaxHold < 0 {
		return fmt.Errorf("--lock-max-hold=%s: must not be negative", o.LockMaxHold)
	}
	if o.RecoverLegacyAfter < 0 {
		return fmt.Errorf("--recover-legacy-after=%s: must not be negative (0 means never)", o.RecoverLegacyAfter)
	}
	switch recovery.Strategy(o.RecoverStrategy) {
	case recovery.StrategyFail, recovery.StrategyRollback:
	default:
		return fmt.Errorf("--recover-strategy=%q: must be fail or rollback", o.RecoverStrategy)
	}
	return nil
}

// policy is the recovery policy the options describe.
func (o *Options) policy() recovery.Policy {
	return recovery.Policy{
		Autorecover: o.Autorecover,
		LegacyAfter: o.RecoverLegacyAfter,
		Strategy:    recovery.Strategy(o.RecoverStrategy),
		Hints:       recovery.CLIHints,
	}
}

// usageWithoutOperation annotates a flag with its usage for the commands
// that run no helm operation after recovery (recover, unlock, the
// controller): UseWithoutOperation puts it in place.
const usageWithoutOperation = "helm-autorecover/usage-without-operation"

// UseWithoutOperation gives fs's flags the usage they have on a command
// that runs no helm operation after recovery (recover, the controller),
// where one exists: "just run the operation" is untrue there.
func UseWithoutOperation(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if u := f.Annotations[usageWithoutOperation]; len(u) == 1 {
			f.Usage = u[0]
		}
	})
}
