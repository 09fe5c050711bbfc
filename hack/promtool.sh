#!/usr/bin/env bash
# Builds (once) promtool, Prometheus' rule checker and rule unit tester, from
# the pinned Prometheus Go module (hack/promtool/go.mod) into $BIN_CACHE and
# prints its path. The chart's alert tests (test/e2e/alerts_test.go) run it.
# Rebuilt only when the build module changes. Service discovery is left out
# (-tags remove_all_sd): promtool's rule commands do not need it, and it is
# most of the build. A cold build takes about 210 CPU-seconds (docs/controller.md,
# "How they are tested"); warm it takes a second.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mkdir -p "$BIN_CACHE"
dir="$HACK_DIR/promtool"
out="$BIN_CACHE/promtool"
stamp=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-16)
# One builder at a time per cache (make tools and a test may both start cold).
exec 9>"$BIN_CACHE/.promtool.lock"
flock 9
if [[ -x $out && "$(cat "$out.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out"
  exit 0
fi
ver=$(modversion "$dir" github.com/prometheus/prometheus)
# The module's v0.MMMPP.X is Prometheus 3.MMM.X (v0.316.0 is 3.16.0): the
# version promtool --version prints.
minor=${ver#v0.3}; minor=${minor%%.*}; patch=${ver##*.}
log "building promtool (prometheus $ver) ... (cold: about 210 CPU-seconds, 8 min on 2 busy cores)"
start=$SECONDS
(cd "$dir" && go build -tags remove_all_sd -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.$((10#$minor)).$patch" \
  -o "$out.tmp" github.com/prometheus/prometheus/cmd/promtool)
mv "$out.tmp" "$out"
echo "$stamp" > "$out.stamp"
log "built promtool in $((SECONDS - start))s"
echo "$out"
