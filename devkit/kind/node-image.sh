#!/usr/bin/env bash
# The kind lane's node image, built here with buildah from the lane's own binaries (no registry: kind's
# `kind build node-image` pulls the base image and every control-plane image; ../shared/docs/kind-offline.md §2).
#
#   1. root:  debootstrap --variant=minbase bookworm with kind's base packages (images/base/Dockerfile), kind's
#             clean-up of systemd units, cached as a tarball keyed by the package list and this script.
#   2. base:  buildah from scratch + that root + kind's images/base/files (from kind's module) + containerd,
#             ctr, containerd-shim-runc-v2, runc and the CNI plugins of devkit/cluster/build.sh; kind's ENV,
#             STOPSIGNAL and ENTRYPOINT: localhost/topology-kind-base:<key>.
#   3. node:  the base + kubeadm (devkit/kind/build.sh), kubelet and kubectl in /usr/bin, /kind/version, and the
#             control-plane, etcd and pause images (node_images.py) in /kind/images, imported at boot
#             by topology-preload.service: localhost/topology-kind-node:v<kubernetes>-<key>.
#   4. podman load of the node image into the lane's engine (skipped when it has that tag already).
#
# Prints the node image's name on the last line (NODE_IMAGE_LOAD=0: build only, load nothing). Needs root, buildah, debootstrap, python3 (PYTHON), and the
# engine's environment (devkit/kind/engine.sh env). Caches: $CLUSTER_CACHE/kind (root tarball, archives) and the
# buildah storage of the real-cluster lane's images.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
# shellcheck source=devkit/kind/versions.env
. "$here/versions.env"
# shellcheck source=devkit/cluster/versions.env
. "$here/../cluster/versions.env"
say() { echo "node-image: $*" >&2; }
die() { say "$*"; exit 1; }
T0=$SECONDS

CLUSTER_BIN=$("$REPO/devkit/cluster/build.sh")
KIND_BIN=$("$here/build.sh")
work="$cache/kind"
mkdir -p "$work"
BUILDAH=(buildah --root "$cache/images/buildah" --runroot /run/s390x-topology-agent-buildah --storage-driver overlay)

# --- 1. the root -------------------------------------------------------------------------------------------
PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps,e2fsprogs
mirror=$(PYTHONPATH="$REPO/devkit" "$PYTHON" -c 'from topology_devkit.realcluster.images import debian_mirror; print(debian_mirror()[0])')
root_key=$(printf '%s\n' "$NODE_SUITE" "$PACKAGES" "$mirror" "$(sed -n '/^# --- 1/,/^# --- 2/p' "$0")" | sha256sum | cut -c1-12)
root_tar="$work/node-root-$root_key.tar"
if [ ! -f "$root_tar" ]; then
  say "debootstrap --variant=minbase $NODE_SUITE with kind's base packages (first build only)"
  t=$SECONDS
  root=$(mktemp -d "$work/root.XXXXXX")
  cleanup_root() {
    # debootstrap mounts /proc and /sys in the root; never remove through a mount (the host's files)
    for m in $(awk -v r="$root" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" || true; done
    if awk -v r="$root" 'index($5, r) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
      say "left $root: still mounted below it"; return
    fi
    rm -rf --one-file-system "$root"
  }
  trap cleanup_root EXIT
  debootstrap --variant=minbase --include="$PACKAGES" "$NODE_SUITE" "$root/fs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log: $work/debootstrap.log)"; }
  fs=$root/fs
  if awk -v r="$fs" 'index($5, r) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    die "debootstrap left mounts below $fs"
  fi
  # kind's base image (images/base/Dockerfile): no tmpfiles-setup, no wanted units but its own, no kmsg in journald
  find "$fs/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$fs"/lib/systemd/system/multi-user.target.wants/* "$fs"/etc/systemd/system/*.wants/* \
        "$fs"/lib/systemd/system/local-fs.target.wants/* "$fs"/lib/systemd/system/sockets.target.wants/*udev* \
        "$fs"/lib/systemd/system/sockets.target.wants/*initctl* "$fs"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >> "$fs/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$fs/sbin/init"
  # kind's clean-install: no apt lists, caches, logs, docs; the machine's files debootstrap copied go too
  rm -rf "$fs"/var/cache/debconf/* "$fs"/var/lib/apt/lists/* "$fs"/var/log/* "$fs"/tmp/* "$fs"/var/tmp/* \
         "$fs"/usr/share/doc/* "$fs"/usr/share/man/* "$fs"/var/cache/apt/archives/*.deb "$fs"/dev/*
  for f in etc/hostname etc/resolv.conf etc/machine-id; do : > "$fs/$f"; done
  tar --numeric-owner --xattrs -C "$fs" -cf "$root_tar.partial" .
  mv "$root_tar.partial" "$root_tar"
  cleanup_root
  trap - EXIT
  say "root: $(du -h "$root_tar" | cut -f1) in $((SECONDS - t)) s"
fi

# --- 2. the base image -------------------------------------------------------------------------------------
base_key=$(printf '%s\n' "$root_key" "$CLUSTER_BIN" "$KIND_BIN" "$(sed -n '/^# --- 2/,/^# --- 3/p' "$0")" \
  "$(cat "$here/node/"*)" | sha256sum | cut -c1-12)
BASE=localhost/topology-kind-base:$base_key
if ! "${BUILDAH[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  say "base image $BASE"
  t=$SECONDS
  c=$("${BUILDAH[@]}" from --pull=never scratch)
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true' EXIT
  "${BUILDAH[@]}" add "$c" "$root_tar" /
  files="$KIND_BIN/base-files"
  "${BUILDAH[@]}" copy --chmod 0755 "$c" "$files/usr/local/bin/" /usr/local/bin/
  "${BUILDAH[@]}" copy "$c" "$files/kind/" /kind/
  "${BUILDAH[@]}" copy --chmod 0755 "$c" "$files/kind/bin/" /kind/bin/
  "${BUILDAH[@]}" copy "$c" "$files/etc/" /etc/
  # kind's containerd config, with this lane's sandbox image and what these machines need: no CAP_SYS_RESOURCE in
  # this VM, so the pause container's oom_score_adj -998 would be refused (the real-cluster lane does the same).
  tmpcfg=$(mktemp)
  sed -e "s#sandbox_image = .*#sandbox_image = \"localhost/topology-kind/pause:3.10\"#" \
      -e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' "$files/etc/containerd/config.toml" > "$tmpcfg"
  grep -q 'restrict_oom_score_adj = true' "$tmpcfg" && grep -q topology-kind/pause "$tmpcfg" \
    || die "kind's containerd config changed: the sandbox_image and restrict_oom_score_adj lines are not there"
  "${BUILDAH[@]}" copy --chmod 0644 "$c" "$tmpcfg" /etc/containerd/config.toml
  PYTHONPATH="$REPO/devkit" "$PYTHON" "$here/node_images.py" cri-base --ctr "$CLUSTER_BIN/ctr" > "$tmpcfg"
  "${BUILDAH[@]}" copy --chmod 0644 "$c" "$tmpcfg" /etc/containerd/cri-base.json
  rm -f "$tmpcfg"
  for b in containerd ctr containerd-shim-runc-v2; do "${BUILDAH[@]}" copy --chmod 0755 "$c" "$CLUSTER_BIN/$b" /usr/local/bin/; done
  "${BUILDAH[@]}" copy --chmod 0755 "$c" "$CLUSTER_BIN/runc" /usr/local/sbin/runc
  "${BUILDAH[@]}" copy --chmod 0755 "$c" "$CLUSTER_BIN/cni/" /opt/cni/bin/
  "${BUILDAH[@]}" copy --chmod 0644 "$c" "$here/node/topology-preload.service" /etc/systemd/system/
  mnt=$("${BUILDAH[@]}" mount "$c")
  # kind's `systemctl enable kubelet containerd undo-mount-hacks; mask systemd-binfmt`, and the preload unit
  for unit in kubelet containerd undo-mount-hacks topology-preload; do
    mkdir -p "$mnt/etc/systemd/system/multi-user.target.wants"
    ln -sf "/etc/systemd/system/$unit.service" "$mnt/etc/systemd/system/multi-user.target.wants/$unit.service"
  done
  ln -sf /dev/null "$mnt/etc/systemd/system/systemd-binfmt.service"
  mkdir -p "$mnt/etc/kubernetes/manifests"
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" config --env container=docker --stop-signal SIGRTMIN+3 \
    --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' --cmd '' "$c"
  "${BUILDAH[@]}" commit --quiet --format docker --rm "$c" "$BASE" >/dev/null
  trap - EXIT
  say "base image in $((SECONDS - t)) s"
fi

# --- 3. the node image -------------------------------------------------------------------------------------
node_key=$(printf '%s\n' "$base_key" "$(sed -n '/^# --- 3/,/^# --- 4/p' "$0")" \
  "$(cat "$here/node_images.py" "$REPO/devkit/topology_devkit/realcluster/pause.c")" \
  | sha256sum | cut -c1-12)
NODE=localhost/topology-kind-node:v$KUBERNETES_VERSION-$node_key
node_tar="$work/node-$node_key.docker.tar"
if [ ! -f "$node_tar" ]; then
  say "node image $NODE"
  t=$SECONDS
  images=$(mktemp -d)
  pause=$(PYTHONPATH="$REPO/devkit" "$PYTHON" -c 'import sys; from pathlib import Path; from topology_devkit.realcluster.images import compile_pause, default_cache; print(compile_pause(default_cache()))')
  PYTHONPATH="$REPO/devkit" "$PYTHON" "$here/node_images.py" images --bin "$CLUSTER_BIN" --pause "$pause" \
    --out "$images" --kubernetes "$KUBERNETES_VERSION" --etcd "$ETCD_VERSION" >/dev/null
  for f in "$images"/*.oci.tar; do mv "$f" "${f%.oci.tar}.tar"; done
  c=$("${BUILDAH[@]}" from --pull=never "$BASE")
  trap '"${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true; rm -rf "$images"' EXIT
  for b in kubelet kubectl; do "${BUILDAH[@]}" copy --chmod 0755 "$c" "$CLUSTER_BIN/$b" /usr/bin/; done
  "${BUILDAH[@]}" copy --chmod 0755 "$c" "$KIND_BIN/kubeadm" /usr/bin/
  "${BUILDAH[@]}" copy --chmod 0644 "$c" "$images/" /kind/images/
  mnt=$("${BUILDAH[@]}" mount "$c")
  echo "v$KUBERNETES_VERSION" > "$mnt/kind/version"
  "${BUILDAH[@]}" umount "$c" >/dev/null
  "${BUILDAH[@]}" commit --quiet --format docker --rm "$c" "$NODE" >/dev/null
  trap - EXIT
  rm -rf "$images"
  rm -f "$work"/node-*.docker.tar
  "${BUILDAH[@]}" push --quiet "$NODE" "docker-archive:$node_tar.partial:$NODE"
  mv "$node_tar.partial" "$node_tar"
  say "node image in $((SECONDS - t)) s ($(du -h "$node_tar" | cut -f1))"
fi

# --- 4. into the engine ------------------------------------------------------------------------------------
if [ "${NODE_IMAGE_LOAD:-1}" = 1 ] && ! podman image exists "$NODE"; then
  t=$SECONDS
  podman load -q -i "$node_tar" >&2
  say "podman load in $((SECONDS - t)) s"
fi
say "ready in $((SECONDS - T0)) s"
echo "$NODE"
