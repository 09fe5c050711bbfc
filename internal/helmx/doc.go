// Package helmx is the only package that leans on Helm v4 SDK seams beyond its
// plain action API: the CLI command tree (cmdtree.go), the stored release
// format (releasecodec.go: decode, edit and re-encode a release Secret without
// losing unknown fields) and the write fence on helm's clients (fence.go and
// the files beside it, one concern each: every write checks the lock; helm's
// record writes carry it and are conditional on the resourceVersion read).
// Keeping them here means a Helm upgrade touches one folder.
package helmx
