// Package recovery owns what happens to a release left pending by a client
// that died: whether it may be recovered now (Decide, a pure function over the
// release history, the lock record, the API server's clock and the user's
// policy), the one write that recovers it (MarkFailed, conditional on the
// resourceVersion read, so it can never overwrite a concurrent writer), and
// undoing what the abandoned revision applied (ConvergeAbandoned).
//
// Recovery never deletes a revision: the abandoned revision stays in history,
// marked failed, with a description that says who abandoned what and when.
// The only objects it deletes are those the abandoned revision itself created
// (created after the revision's Secret, carrying this release's ownership
// annotations and managed-by label, without helm.sh/resource-policy: keep);
// every other object it touches is only patched back to the last deployed
// revision, and objects not owned by the release are never touched.
//
// # Convergence: undoing what an abandoned revision applied
//
// A revision abandoned while pending may have applied part or all of its
// manifest before its client died: changed fields of existing objects, and
// new objects. Marking it failed does not undo any of that, and helm's next
// upgrade does not either: it diffs the new revision against the last
// *deployed* revision, so a field that only the abandoned revision set (a
// nodeSelector that leaves a Deployment unschedulable) survives a
// client-side apply, and an object that only the abandoned revision created
// survives any apply method. Converge brings the live objects back to the
// last deployed revision, for exactly what the abandoned revision touched,
// before the requested operation runs; that operation then starts from the
// state its diff assumes, and afterwards the live objects match the revision
// it writes.
//
// The rules:
//
//   - An object in both manifests whose rendering differs between the two
//     revisions is reverted to the last deployed rendering, with the apply
//     method the abandoned revision used (ConvergeMethod). Client-side: a
//     three-way patch with original = the abandoned revision's object,
//     modified = the last deployed object, current = the live object (the
//     patch helm's own client-side update computes, with the abandoned
//     revision as the original); fields the abandoned revision added are
//     removed, fields it changed are set back, changes made by other writers
//     to fields neither revision mentions stay. Server-side: the last
//     deployed object is applied under the field manager "helm", without
//     forcing conflicts, exactly as helm applies it; fields that only the
//     abandoned revision's apply owned are removed by the API server.
//     Objects whose two renderings are equal are not written at all.
//   - An object only in the abandoned revision is deleted when it is live,
//     carries this release's ownership metadata (annotations
//     meta.helm.sh/release-name and meta.helm.sh/release-namespace naming
//     this release, and label app.kubernetes.io/managed-by=Helm, helm's own
//     test of ownership), has no helm.sh/resource-policy: keep (on the live
//     object or in the manifest), and was created by the abandoned revision:
//     its server-set creationTimestamp is not before the server-set
//     creationTimestamp of the abandoned revision's Secret, and, when both
//     fall in the same second, no field manager but helm's wrote it (status
//     writes aside). An object that existed before (adopted with
//     --take-ownership, or kept from an older revision) is left alone,
//     because its earlier state is unknown. Unless helm's rollback
//     follows (ConvergeOptions.DeferRemovals) it is not deleted yet: it is
//     recorded on the revision marked failed (MarkFailedLeaving, LoadLeft),
//     and RemoveDeferred deletes it by the same rules once the next upgrade
//     or install has written its revision, only if that revision does not
//     render it again, so nothing is deleted and created again. Without
//     ConvergeOptions.DeleteData, nothing whose deletion destroys data is
//     deleted (dataHolder: claims, volumes, CRDs, Namespaces, StatefulSets
//     whose claims go with them, LoadBalancer Services), nor any object
//     whose deletion would make the garbage collector delete one of those
//     (cascadeGuard follows ownerReferences).
//   - An object that is not owned by this release is never written, whether
//     it is in one manifest or both.
//   - An object only in the last deployed revision (the abandoned revision
//     may have deleted it) is not recreated: helm's next upgrade creates
//     every object of the new revision that is missing, and recreating one
//     the new revision drops would only churn.
//   - Every write is conditional on the resourceVersion read (patches and
//     applies carry metadata.resourceVersion, deletes carry UID and
//     resourceVersion preconditions); on a conflict the object is read again
//     and decided again, a few times, never overwritten blindly.
//
// Hooks of the abandoned revision are not in its manifest and are not
// touched; helm's hook delete policies handle them on the next run.
//
// No deployed revision (an abandoned pending-install, or a history with no
// deployed revision left): Converge does nothing. Helm's own next operation
// already converges in that case: `upgrade` (and `upgrade --install`) diffs
// against the latest revision when none is deployed, which is the abandoned
// one, so it removes the fields and deletes the objects the abandoned
// revision applied and the new one does not ask for; `rollback` and
// `uninstall` diff against, or delete, the latest revision's manifest too.
// Deleting the abandoned install's objects ahead of that would make
// Deployments and volumes churn through a delete and a recreate for nothing.
// (`install --replace` adopts the owned objects, as after any failed install
// of stock helm.)
//
// Converge runs before upgrade and install, and when no operation follows
// the recovery (recover, unlock, an embedder's Recover): the release then
// ends as it was last deployed. Rollback and uninstall take the latest
// revision, the abandoned one, as their base already, and converging to the
// last deployed revision first could even hide from a rollback's three-way
// patch a field it must remove.
package recovery
