#!/usr/bin/env bash
# Builds KWOK (sigs.k8s.io/kwok, the simulated nodes of bench/cluster/simulated_nodes.py) from the Go module proxy,
# pinned by devkit/cluster/go/kwok (go.mod + go.sum), into the lane's cache beside its other builds, keyed by those
# pins: only the first build on a machine pays. Not part of the lane (build.sh) nor of CI: make kwok-build.
#
#   devkit/cluster/build-kwok.sh            build (or reuse) and print the bin folder on the last line
#   devkit/cluster/build-kwok.sh --print    print the bin folder of the current pins, build nothing
#
# CLUSTER_CACHE (default ~/.cache/s390x-topology-agent/cluster) holds GOMODCACHE and GOCACHE (shared with build.sh)
# and one kwok-<key> folder per set of pins, with build-info.json (version, Go, seconds, size).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
# shellcheck source=devkit/cluster/versions.env
. "$here/versions.env"

key=$( (cd "$here" && cat build-kwok.sh && printf 'KWOK_VERSION=%s\nGO_MIN=%s\n' "$KWOK_VERSION" "$GO_MIN" &&
        cat go/kwok/go.mod go/kwok/go.sum go/kwok/tools.go) | sha256sum | cut -c1-16)
bin="$cache/kwok-$key"
if [ "${1:-}" = --print ]; then echo "$bin"; exit 0; fi
if [ -f "$bin/build-info.json" ]; then
  echo "kwok: cached in $bin" >&2
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "kwok-build: go is not installed (Go $GO_MIN or newer is needed)" >&2; exit 2; }
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | head -1)" != "$GO_MIN" ]; then
  echo "kwok-build: Go $have is older than $GO_MIN" >&2; exit 2
fi
grep -q "^require sigs.k8s.io/kwok v$KWOK_VERSION\$" "$here/go/kwok/go.mod" || {
  echo "kwok-build: go/kwok/go.mod does not pin sigs.k8s.io/kwok v$KWOK_VERSION (versions.env)" >&2; exit 2; }

export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gocache" GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
mkdir -p "$GOMODCACHE" "$GOCACHE"
tmp="$bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
echo "kwok-build: sigs.k8s.io/kwok v$KWOK_VERSION" >&2
# The version is KWOK's own constant at the tag (pkg/consts.Version), as its release script sets it.
(cd "$here/go/kwok" && CGO_ENABLED=0 go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
  -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) || { echo "kwok-build: building kwok failed (see above)" >&2; exit 1; }
# KWOK's own stages (kustomize/stage at the tag) for its --config: nodes Ready with leases, pods Ready, pods deleted
# once marked for deletion.
src=$(cd "$here/go/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
sep=""
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready \
             pod/fast/pod-delete; do
  printf '%s' "$sep"; cat "$src/kustomize/stage/$stage.yaml"; sep=$'---\n'
done > "$tmp/stages.yaml"
seconds=$(( $(date +%s) - start ))
cat > "$tmp/build-info.json" <<JSON
{"kwok": "v$KWOK_VERSION", "go": "$(go env GOVERSION)", "seconds": $seconds, "bin_bytes": $(du -sb "$tmp" | cut -f1)}
JSON
rm -rf "$bin"
mv "$tmp" "$bin"
echo "kwok-build: built in $seconds s into $bin" >&2
cat "$bin/build-info.json" >&2
echo "$bin"
