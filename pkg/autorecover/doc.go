// Package autorecover lets programs that drive Helm 4 through its Go SDK (CI
// tools, GitOps controllers) take part in helm-autorecover's protocol: a
// per-release lock with an owner and an expiry, automatic recovery of
// releases whose last operation was abandoned pending, and release writes
// that are fenced by the lock. Releases it writes are ordinary Helm releases;
// stock helm 3 and 4 read them, and the helm-autorecover CLI and controller
// respect the locks it takes (and it theirs).
//
// # Run
//
// Client.Run is the whole protocol around one helm action, in the manner of
// client-go's leaderelection.RunOrDie:
//
//	c, err := autorecover.NewClient(restConfig)
//	err = c.Run(ctx, autorecover.RunConfig{
//		Lock:   autorecover.LockRequest{Release: "web", Namespace: "shop", Operation: autorecover.OpUpgrade, Wait: time.Minute},
//		Policy: autorecover.Policy{LegacyAfter: autorecover.DefaultLegacyAfter},
//	}, func(ctx context.Context, cfg *action.Configuration) error {
//		up := action.NewUpgrade(cfg)
//		_, err := up.RunWithContext(ctx, "web", chrt, values)
//		return err
//	})
//
// It takes the lock (or waits for it in arrival order), recovers what a
// dead holder left, keeps the lock renewed, runs the action with a
// configuration whose every write is fenced by the lock, and releases the
// lock. examples/embed in this module is a complete program.
//
// # The contract, step by step
//
// For those who drive the steps themselves, a mutating operation on a
// release (install, upgrade, rollback, uninstall) runs like this:
//
//  1. Client.Acquire takes the release's lock before the release is read
//     for modification: on the release's newest stored record (every
//     client of the protocol takes this one, so clients of either backend
//     exclude each other) and, with BackendLease (what BackendAuto picks
//     when the caller may use Leases), in a coordination.k8s.io/v1 Lease
//     helm-autorecover.v1.<release>. The lock's record says who holds it,
//     for what, since when and until when (LOCKED TILL). If a live holder
//     has it, Acquire fails at once with a *LockedError
//     (errors.Is(err, ErrLocked)) naming the holder, or waits for it in
//     arrival order when LockRequest.Wait is set.
//  2. Lock.Recover, right after Acquire, recovers what a holder that died
//     left behind, exactly as the helm-autorecover CLI does: a pending
//     revision written under a lock that has since expired is recovered at
//     once (what it applied is undone, and it is marked failed with a
//     description naming who abandoned it and when); a pending revision no
//     lock covers (stock helm) only after Policy.LegacyAfter of server
//     time, and while none of its hook Jobs or Pods still runs (its helm
//     may still be at work; they are read only then).
//  3. Lock.Keep runs beside the operation and renews the lock every third of
//     its lease. When it cannot (the renew deadline passed, someone took the
//     lock over, or LockRequest.MaxHold ran out) it calls onLost, and the
//     caller must stop the operation.
//  4. Lock.ActionConfig gives the operation a helm configuration whose
//     every request goes through the lock's write fence (FencedStorage
//     fences an existing configuration's release storage): no write leaves
//     once the lock is lost; helm's create of the pending revision carries
//     the lock, in one atomic write; its rewrites of release records are
//     conditional on the resourceVersion read and refused when another
//     session's lock is on them.
//  5. Lock.Release gives the lock back when the operation ends, success or
//     failure.
//
// Client.Recover does steps 1, 2 and 5 alone, for tools that only clean up
// (with RecoverRequest.DryRun it takes no lock and writes nothing), and
// Client.Inspect reads a release's lock and whether its latest revision is
// pending, without changing anything.
//
// # Storage drivers
//
// WithStorageDriver names helm's driver: secret (the default), configmap,
// or sql, whose releases live in PostgreSQL (WithSQLConnectionString, or
// HELM_DRIVER_SQL_CONNECTION_STRING as for helm). With sql the lock is a
// row beside helm's table, a trigger refuses helm's writes of a session
// that no longer holds it, and recovery reads and marks helm's rows. The
// Client keeps one pool to the database (Close ends it); each lock opens
// helm's own sql driver for its session in ActionConfig and closes it when
// the lock is given back. memory is refused: its releases live in one
// process, where no other client could see a lock.
//
// # Time
//
// Expiry is judged in the API server's clock, never the local one: a
// Client estimates the server's clock from the Date headers of the
// responses it receives (about a second of uncertainty, narrowed by timing
// requests), writes every time as an upper bound of that estimate, and
// declares another session's lock expired only when the lower bound has
// passed its LOCKED TILL plus a 250 ms margin. A holder, for its part,
// considers its lock lost one second before its lease ends, measured on its
// own monotonic clock from the send time of its last renewal. A client whose
// wall clock is minutes off therefore neither steals a live lock nor waits
// longer than the lock's expiry.
//
// # What fencing does not cover
//
// The check and the write are not atomic: a process paused for longer than
// its lease between Lock.Valid and the request that follows can still send
// one write after its lock was taken over. Rewrites of existing records are
// still refused then when the new holder's lock is on them; the objects
// helm applies are written by then, which is why the operation must stop
// when Keep reports the loss (Run cancels its context).
//
// Helm applies objects with server-side apply under a field manager named
// after the program (kube.ManagedFieldsManager, default the executable's
// name). Set it to "helm" when the same releases are also upgraded with the
// helm CLI, or the two will conflict over field ownership.
package autorecover
