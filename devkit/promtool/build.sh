#!/usr/bin/env bash
# Builds promtool (for `promtool check rules` on the chart's PrometheusRule) from the Go module proxy, pinned by the
# small Go module beside this script (go.mod + go.sum), into a cache folder outside the work tree keyed by those pins.
#
#   devkit/promtool/build.sh            build (or reuse) and print promtool's path on the last line
#   devkit/promtool/build.sh --print    print where promtool of the current pins is (built or not), build nothing
#
# PROMTOOL_CACHE (default ~/.cache/s390x-topology-agent/promtool) holds bin-<key>/promtool. GOMODCACHE and GOCACHE are
# shared with the real-cluster lane's (~/.cache/s390x-topology-agent/cluster/{gomod,gocache}), which already holds
# many of the same modules. Needs Go 1.26.7 or newer (GOTOOLCHAIN=local: nothing else is downloaded).
set -euo pipefail
mod=$(cd "$(dirname "$0")" && pwd)
base=${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent
cache=${PROMTOOL_CACHE:-$base/promtool}
key=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "$0" | sha256sum | cut -c1-16)
bin="$cache/bin-$key"
if [ "${1:-}" = --print ]; then echo "$bin/promtool"; exit 0; fi
if [ -x "$bin/promtool" ]; then
  echo "promtool: cached in $bin" >&2
  echo "$bin/promtool"
  exit 0
fi
command -v go >/dev/null || { echo "build-promtool: go is not installed (Go 1.26.7 or newer is needed)" >&2; exit 2; }
export GOMODCACHE=${GOMODCACHE:-$base/cluster/gomod} GOCACHE=${GOCACHE:-$base/cluster/gocache} GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false" GOPROXY=${GOPROXY:-https://proxy.golang.org}
mkdir -p "$GOMODCACHE" "$GOCACHE" "$cache"
tmp="$bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
t0=$(date +%s)
echo "build-promtool: building github.com/prometheus/prometheus/cmd/promtool (cold: several minutes)" >&2
(cd "$mod" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$tmp/promtool" github.com/prometheus/prometheus/cmd/promtool) || {
  echo "build-promtool: building promtool failed (see above)" >&2; exit 1; }
rm -rf "$bin"
mv "$tmp" "$bin"
echo "build-promtool: took $(( $(date +%s) - t0 )) s" >&2
echo "$bin/promtool"
