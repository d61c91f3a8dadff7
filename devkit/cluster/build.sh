#!/usr/bin/env bash
# Builds the real-cluster lane's upstream binaries from the Go module proxy, pinned by the small Go
# modules in devkit/cluster/go/*/ (go.mod + go.sum), into a cache folder outside the work tree keyed by
# those pins: only the first build on a machine pays (../shared/docs/real-cluster.md).
#
#   devkit/cluster/build.sh            build (or reuse) and print the bin folder on the last line
#   devkit/cluster/build.sh --print    print the bin folder of the current pins, build nothing
#
# CLUSTER_CACHE (default ~/.cache/s390x-topology-agent/cluster) holds GOMODCACHE, GOCACHE and one
# bin-<key> folder per set of pins; a finished folder carries build-info.json (versions, seconds, sizes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
# shellcheck source=devkit/cluster/versions.env
. "$here/versions.env"

key=$(cd "$here" && cat versions.env build.sh go/*/go.mod go/*/go.sum go/*/tools.go | sha256sum | cut -c1-16)
bin="$cache/bin-$key"
if [ "${1:-}" = --print ]; then echo "$bin"; exit 0; fi
if [ -f "$bin/build-info.json" ]; then
  echo "cluster binaries: cached in $bin" >&2
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "cluster-build: go is not installed (Go $GO_MIN or newer is needed)" >&2; exit 2; }
# runc needs cgo with libseccomp (as upstream's release builds); the rest is static (CGO_ENABLED=0).
if ! pkg-config --exists libseccomp 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "cluster-build: installing libseccomp-dev pkg-config (runc's seccomp support)" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev >/dev/null
  else
    echo "cluster-build: runc needs libseccomp-dev and pkg-config: apt-get install libseccomp-dev pkg-config" >&2
    exit 2
  fi
fi

export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gocache" GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
mkdir -p "$GOMODCACHE" "$GOCACHE"
tmp="$bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
mod_before=$(du -sb "$GOMODCACHE" | cut -f1)

step() { # name dir cgo ldflags packages...
  local name=$1 dir=$2 cgo=$3 ldflags=$4; shift 4
  local t0; t0=$(date +%s)
  echo "cluster-build: $name" >&2
  (cd "$here/go/$dir" && CGO_ENABLED=$cgo go build -ldflags "$ldflags" -o "$tmp/" "$@") || {
    echo "cluster-build: building $name failed (see above)" >&2; exit 1; }
  echo "cluster-build: $name took $(( $(date +%s) - t0 )) s" >&2
}

kv=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
kflags="-s -w"
for p in "$kv" "$cv"; do
  kflags="$kflags -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=${KUBERNETES_VERSION%%.*}"
  kflags="$kflags -X $p.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) -X $p.gitTreeState=clean"
  kflags="$kflags -X $p.buildDate=$KUBERNETES_BUILD_DATE"
done

step etcd etcd 0 "-s -w" go.etcd.io/etcd/server/v3
mv "$tmp/v3" "$tmp/etcd" 2>/dev/null || mv "$tmp/server" "$tmp/etcd" 2>/dev/null || true
step containerd containerd 0 "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
(cd "$here/go/runc" && echo "cluster-build: runc" >&2 && CGO_ENABLED=1 go build -tags seccomp \
  -ldflags "-s -w -X main.version=$RUNC_VERSION" -o "$tmp/runc" github.com/opencontainers/runc)
mkdir -p "$tmp/cni"
(cd "$here/go/cni" && echo "cluster-build: CNI plugins" >&2 && CGO_ENABLED=0 go build \
  -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v$CNI_PLUGINS_VERSION" \
  -o "$tmp/cni/" github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap)
step kubernetes kubernetes 0 "$kflags" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl

seconds=$(( $(date +%s) - start ))
mod_after=$(du -sb "$GOMODCACHE" | cut -f1)
cat > "$tmp/build-info.json" <<EOF
{"kubernetes": "v$KUBERNETES_VERSION", "etcd": "v$ETCD_VERSION", "containerd": "v$CONTAINERD_VERSION",
 "runc": "v$RUNC_VERSION", "cni_plugins": "v$CNI_PLUGINS_VERSION", "go": "$(go env GOVERSION)",
 "seconds": $seconds, "module_download_bytes": $(( mod_after - mod_before )),
 "gomodcache_bytes": $mod_after, "gocache_bytes": $(du -sb "$GOCACHE" | cut -f1),
 "bin_bytes": $(du -sb "$tmp" | cut -f1)}
EOF
rm -rf "$bin"
mv "$tmp" "$bin"
echo "cluster-build: built in $seconds s into $bin" >&2
cat "$bin/build-info.json" >&2
echo "$bin"
