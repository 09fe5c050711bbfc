package exitcode

// Doc documents one exit code for people: what it means and what to do.
// docs/exit-codes.md is generated from Docs (go run ./hack/gendocs), and a
// test fails when it is stale or a code is missing.
type Doc struct {
	Code    int
	Meaning string
	Action  string
}

// Docs documents every exit code, in order.
var Docs = []Doc{
	{OK, "success", ""},
	{Failure, "helm failed (chart, values, cluster errors...)", "read the message; same as stock helm"},
	{Usage, "the command line cannot be used, on every command (helm's own and helm-autorecover's alike): an unknown command or flag, a flag value that does not parse or is out of range (`--lease-duration` must be 3s to 10m), a wrong number of arguments, a release name helm would refuse, `-o` other than table, json or yaml, `unlock` without `--session`; or a `HELM_AUTORECOVER_*` variable the command uses does not parse (a command that does not use it, or that is given the flag, is not affected: `version`, `list`, completion keep working). Nothing is read or written. Stock helm exits 1 for the same mistakes", "the message names the flag, argument or variable"},
	{Locked, "another live client holds the release's lock (and `--lock-timeout`, if set, ran out), or a lock record that cannot be read holds it (the message says so and points to `locks`, which says how to clear it); `unlock` without `--force` on a live lock; `recover` (with or without `--dry-run`) on a release pending under a live lock", "the message names the holder (who, pid, session, operation, since, LOCKED TILL); wait with `--lock-timeout=DURATION`; `unlock --force` only if you know the holder is dead"},
	{LockLost, "this process lost its lock (could not renew before its renew deadline, or found it taken) and stopped before writing again", "run the command again: it recovers the revision once the lock has expired"},
	{Pending, "the release is pending and may not be recovered now: a revision left by stock helm younger than `--recover-legacy-after`, or `--autorecover=false` (also `recover`, with or without `--dry-run`)", "the message says when it becomes recoverable; or run `helm rollback` with `--autorecover=false`; or `recover --recover-legacy-after=DURATION` if you know no helm process is running"},
	{MaxHold, "the operation held its lock longer than `--lock-max-hold` and was aborted; its revision was marked failed", "raise `--lock-max-hold` or `--timeout`"},
	{NotFound, "`locks RELEASE`, `unlock`, `recover`: the release is unknown (no stored revision, and nobody holds its lock: a lock object left by an earlier version for a release that never existed does not count), has no stored revision, or (`unlock`) nobody holds its lock, or the named session already released it", "check the name and `-n`; `helm-autorecover list -A`, `helm-autorecover locks -A`"},
	{WrongSession, "`unlock`: `--session` does not name the lock's holder (or the holder changed while unlocking)", "the message names the holder's session; check it with `helm-autorecover locks RELEASE`"},
	{BadLock, "`unlock`, `recover`: the release's Lease or its lock record cannot be trusted (annotation unreadable, newer or foreign schema, holderIdentity not the record's session, record of another release or namespace, held with no record: written by another tool or edited by hand); nothing was written", "the message names the object (`lease/helm-autorecover.v1.RELEASE`, or `secret/...`/`configmap/...` for a lock on the newest release record) and how to inspect it; if no helm-autorecover process works on the release, delete the Lease (or remove the record's `helm-autorecover.io/lock` annotation with `kubectl annotate ... helm-autorecover.io/lock-`) and run `helm-autorecover recover RELEASE --recover-legacy-after=1s`. `locks` shows such a lock with a warning on stderr and exits 0"},
	{Declined, "`unlock --force` on a live lock was not confirmed: the answer was not `yes` (`y` is not enough), or stdin is not a terminal and `--yes` was not given; nothing was written", "answer `yes`, or pass `--yes` in scripts"},
	{Preempted, "the operation was stopped at the request of another client waiting for the release's lock with `--preempt`: helm's install or upgrade was cancelled, its revision marked failed with a description naming who asked, and the lock given back to the clients waiting for it, in arrival order", "nothing to repair: the client that asked now runs its own operation; use `--preempt` only where a newer deploy should replace a running one"},
	{Interrupted, "interrupted by SIGINT or SIGTERM; the release was marked failed and the lock released", ""},
}
