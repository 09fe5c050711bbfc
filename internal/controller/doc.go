// Package controller is helm-autorecover's in-cluster controller: it
// watches helm's pending release records (metadata only, label-selected)
// in all namespaces or a list of them, and recovers a release through the
// one recovery core (internal/protocol, as the CLI's recover command) at
// the moment its lock expires, or its lock-less pending revision passes
// --recover-legacy-after, in the API server's time. A live holder is never
// touched: the decision is recovery.Decide's, and every write is made under
// the release's own lock and conditional on what was read.
//
// Next, a pure function with a table of cases, says what to do with a
// release once judged: recover now, look again at a given moment, or wait
// for its records to change. Leader election, metrics, health endpoints
// and the cache come from controller-runtime.
package controller
