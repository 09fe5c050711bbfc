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
package recovery
