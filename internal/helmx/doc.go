// Package helmx is the only package that leans on Helm v4 SDK seams beyond its
// plain action API: the CLI command tree and, later, the fenced storage driver.
// Keeping them here means a Helm upgrade touches one folder.
package helmx
