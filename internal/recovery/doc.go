// Package recovery owns what happens to a release left pending by a client
// that died: whether it may be recovered now (Decide, a pure function over the
// release history, the lock record, the API server's clock and the user's
// policy) and the one write that recovers it (MarkFailed, conditional on the
// resourceVersion read, so it can never overwrite a concurrent writer).
//
// Recovery never deletes a revision or a resource: the abandoned revision
// stays in history, marked failed, with a description that says who
// abandoned what and when.
package recovery
