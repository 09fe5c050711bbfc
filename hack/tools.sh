#!/usr/bin/env bash
# Installs the pinned developer tools (hack/tools/go.mod) into $(go env GOPATH)/bin.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$HACK_DIR/tools"
want=$(go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
bin="$(go env GOPATH)/bin/golangci-lint"
if [[ -x $bin ]] && "$bin" version 2>/dev/null | grep -q "${want#v}"; then
  exit 0
fi
log "installing golangci-lint $want"
go build -ldflags "-X main.version=${want#v}" -o "$bin" github.com/golangci/golangci-lint/v2/cmd/golangci-lint
