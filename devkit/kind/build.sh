#!/usr/bin/env bash
# Builds the kind lane's own binaries from the Go module proxy: kind (devkit/kind/go/kind) and kubeadm
# (devkit/kind/go/kubeadm, the same Kubernetes as the real-cluster lane), into a folder outside the work tree keyed
# by their pins. The rest of the node (kubelet, kubectl, the control plane, etcd, containerd, runc, CNI) is the
# real-cluster lane's build (devkit/cluster/build.sh), shared with it.
#
#   devkit/kind/build.sh            build (or reuse) and print the bin folder on the last line
#   devkit/kind/build.sh --print    print the bin folder of the current pins, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
# shellcheck source=devkit/kind/versions.env
. "$here/versions.env"
# shellcheck source=devkit/cluster/versions.env
. "$here/../cluster/versions.env"
key=$(cd "$here" && cat versions.env build.sh ../cluster/versions.env go/*/go.mod go/*/go.sum go/*/tools.go | sha256sum | cut -c1-16)
bin="$cache/kind-bin-$key"
if [ "${1:-}" = --print ]; then echo "$bin"; exit 0; fi
if [ -f "$bin/build-info.json" ]; then
  echo "kind binaries: cached in $bin" >&2
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "kind-build: go is not installed (Go $GO_MIN or newer is needed)" >&2; exit 2; }
export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gocache" GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
mkdir -p "$GOMODCACHE" "$GOCACHE"
tmp="$bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
kv=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
kflags="-s -w"
for p in "$kv" "$cv"; do
  kflags="$kflags -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=${KUBERNETES_VERSION%%.*}"
  kflags="$kflags -X $p.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) -X $p.gitTreeState=clean"
  kflags="$kflags -X $p.buildDate=$KUBERNETES_BUILD_DATE"
done
echo "kind-build: kind v$KIND_VERSION" >&2
(cd "$here/go/kind" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$tmp/kind" sigs.k8s.io/kind)
echo "kind-build: kubeadm v$KUBERNETES_VERSION" >&2
(cd "$here/go/kubeadm" && CGO_ENABLED=0 go build -ldflags "$kflags" -o "$tmp/kubeadm" k8s.io/kubernetes/cmd/kubeadm)
# kind's node-image files (images/base/files: the entrypoint, systemd units, containerd's base config) come with
# its module; the node image is built from them (devkit/kind/node-image.sh).
src="$GOMODCACHE/sigs.k8s.io/kind@v$KIND_VERSION/images/base/files"
[ -d "$src" ] || { echo "kind-build: $src is missing from the module cache" >&2; exit 1; }
mkdir -p "$tmp/base-files"
cp -a "$src/." "$tmp/base-files/"
chmod -R u+w "$tmp/base-files"
seconds=$(( $(date +%s) - start ))
cat > "$tmp/build-info.json" <<JSON
{"kind": "v$KIND_VERSION", "kubeadm": "v$KUBERNETES_VERSION", "go": "$(go env GOVERSION)", "seconds": $seconds}
JSON
rm -rf "$bin"
mv "$tmp" "$bin"
echo "kind-build: built in $seconds s into $bin" >&2
echo "$bin"
