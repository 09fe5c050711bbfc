// Package helmx is the only package that leans on Helm v4 SDK seams beyond its
// plain action API: the CLI command tree (cmdtree.go), the stored release
// format (releasecodec.go: decode, edit and re-encode a release Secret without
// losing unknown fields) and the fenced storage driver (fenced.go: every
// release write checks the lock and is conditional on the resourceVersion
// read). Keeping them here means a Helm upgrade touches one folder.
package helmx
