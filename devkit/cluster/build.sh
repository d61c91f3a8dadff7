#!/usr/bin/env bash
# Builds the real-cluster lane's upstream binaries from the Go module proxy, pinned by the small Go
# modules in devkit/cluster/go/*/ (go.mod + go.sum), into a cache folder outside the work tree keyed by
# those pins: only the first build on a machine pays (../shared/docs/real-cluster.md).
#
#   devkit/cluster/build.sh [SET]            build (or reuse) and print the bin folder on the last line
#   devkit/cluster/build.sh --print [SET]    print the bin folder of the current pins, build nothing
#
# SET is the node's runtime and the binaries that go with it (default containerd):
#   containerd  Kubernetes 1.37, etcd, containerd, runc, the CNI plugins
#   crio        Kubernetes 1.34 (the minor CRI-O 1.34 is made for), etcd, CRI-O with pinns and its image copier,
#               runc, the CNI plugins; conmon is Debian's (.ci/run installs it)
#
# CLUSTER_CACHE (default ~/.cache/s390x-topology-agent/cluster) holds GOMODCACHE, GOCACHE and one bin-<key> folder
# per set of pins; a finished folder carries build-info.json (versions, seconds, sizes). Each set's key covers this
# script, its own variables of versions.env and its own modules only, so a change to one runtime's pins rebuilds
# that set alone, and the Go build cache beside them makes a set whose key changed with nothing else cost its links.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
# shellcheck source=devkit/cluster/versions.env
. "$here/versions.env"

print=0
if [ "${1:-}" = --print ]; then print=1; shift; fi
set_name=${1:-containerd}
case "$set_name" in
  containerd)
    modules="etcd containerd runc cni kubernetes"
    vars="KUBERNETES_VERSION KUBERNETES_BUILD_DATE ETCD_VERSION CONTAINERD_VERSION RUNC_VERSION CNI_PLUGINS_VERSION GO_MIN"
    prefix=bin ;;
  crio)
    modules="etcd crio runc cni kubernetes-1.34"
    vars="CRIO_KUBERNETES_VERSION KUBERNETES_BUILD_DATE ETCD_VERSION CRIO_VERSION CRIO_BUILD_DATE CRIO_BUILD_TAGS RUNC_VERSION"
    vars="$vars CNI_PLUGINS_VERSION CONMON_DEBIAN_VERSION GO_MIN"
    prefix=bin-crio ;;
  *) echo "cluster-build: the set is containerd or crio, not '$set_name'" >&2; exit 2 ;;
esac

key=$( (cd "$here" && cat build.sh && for v in $vars; do printf '%s=%s\n' "$v" "${!v}"; done &&
        for m in $modules; do cat "go/$m/go.mod" "go/$m/go.sum" "go/$m/tools.go"; done) | sha256sum | cut -c1-16)
bin="$cache/$prefix-$key"
if [ "$print" = 1 ]; then echo "$bin"; exit 0; fi
if [ -f "$bin/build-info.json" ]; then
  echo "cluster binaries ($set_name): cached in $bin" >&2
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "cluster-build: go is not installed (Go $GO_MIN or newer is needed)" >&2; exit 2; }
# runc and CRI-O need cgo with libseccomp (as upstream's release builds); the rest is static (CGO_ENABLED=0).
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

kube_flags() { # version: the ldflags that make the binaries report it (else v0.0.0-master)
  local flags="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags="$flags -X $p.gitVersion=v$1 -X $p.gitMajor=${1%%.*}"
    flags="$flags -X $p.gitMinor=$(echo "$1" | cut -d. -f2) -X $p.gitTreeState=clean"
    flags="$flags -X $p.buildDate=$KUBERNETES_BUILD_DATE"
  done
  echo "$flags"
}

step etcd etcd 0 "-s -w" go.etcd.io/etcd/server/v3
mv "$tmp/v3" "$tmp/etcd" 2>/dev/null || mv "$tmp/server" "$tmp/etcd" 2>/dev/null || true
if [ "$set_name" = containerd ]; then
  step containerd containerd 0 "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
else
  # CRI-O's Makefile at v1.34.0 (BUILDTAGS, bin/crio, bin/pinns, test/copyimg), with the tags that drop what needs
  # other C libraries (versions.env): cgo for libseccomp. copyimg is CRI-O's own image copier into containers/storage,
  # the lane's import (no registry). pinns, CRI-O's namespace pinner, is C: built as its pinns/Makefile does.
  step cri-o crio 1 "-s -w -X github.com/cri-o/cri-o/internal/version.buildDate=$CRIO_BUILD_DATE" \
    -tags "$CRIO_BUILD_TAGS" github.com/cri-o/cri-o/cmd/crio github.com/cri-o/cri-o/test/copyimg
  crio_src=$(cd "$here/go/crio" && go list -m -f '{{.Dir}}' github.com/cri-o/cri-o)
  echo "cluster-build: pinns" >&2
  cc -std=c99 -Os -O3 -Wall -Werror -Wextra -static -o "$tmp/pinns" "$crio_src"/pinns/src/*.c
  strip -s "$tmp/pinns"
fi
(cd "$here/go/runc" && echo "cluster-build: runc" >&2 && CGO_ENABLED=1 go build -tags seccomp \
  -ldflags "-s -w -X main.version=$RUNC_VERSION" -o "$tmp/runc" github.com/opencontainers/runc)
mkdir -p "$tmp/cni"
(cd "$here/go/cni" && echo "cluster-build: CNI plugins" >&2 && CGO_ENABLED=0 go build \
  -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v$CNI_PLUGINS_VERSION" \
  -o "$tmp/cni/" github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap)
if [ "$set_name" = containerd ]; then
  kube_dir=kubernetes kube_version=$KUBERNETES_VERSION
else
  kube_dir=kubernetes-1.34 kube_version=$CRIO_KUBERNETES_VERSION
fi
step "kubernetes $kube_version" "$kube_dir" 0 "$(kube_flags "$kube_version")" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl

seconds=$(( $(date +%s) - start ))
mod_after=$(du -sb "$GOMODCACHE" | cut -f1)
if [ "$set_name" = containerd ]; then
  runtime_info="\"containerd\": \"v$CONTAINERD_VERSION\""
else
  runtime_info="\"crio\": \"v$CRIO_VERSION\", \"crio_build_tags\": \"$CRIO_BUILD_TAGS\", \"conmon\": \"Debian $CONMON_DEBIAN_VERSION\""
fi
cat > "$tmp/build-info.json" <<EOF
{"set": "$set_name", "kubernetes": "v$kube_version", "etcd": "v$ETCD_VERSION", $runtime_info,
 "runc": "v$RUNC_VERSION", "cni_plugins": "v$CNI_PLUGINS_VERSION", "go": "$(go env GOVERSION)",
 "seconds": $seconds, "module_download_bytes": $(( mod_after - mod_before )),
 "gomodcache_bytes": $mod_after, "gocache_bytes": $(du -sb "$GOCACHE" | cut -f1),
 "bin_bytes": $(du -sb "$tmp" | cut -f1)}
EOF
rm -rf "$bin"
mv "$tmp" "$bin"
echo "cluster-build: $set_name built in $seconds s into $bin" >&2
cat "$bin/build-info.json" >&2
echo "$bin"
