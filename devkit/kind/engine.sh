#!/usr/bin/env bash
# The kind lane's container engine: rootful Podman from Debian (kind's other provider, KIND_EXPERIMENTAL_PROVIDER=
# podman), set up by the lane itself, and the host put back as it was. Run it under the machine lock (flock
# /tmp/realcluster.lock) and in a mount namespace of the lane's own (devkit/kind/run.sh does both): the real-cluster
# lane uses the same kernel, bridge netfilter and iptables.
#
#   devkit/kind/engine.sh up     install podman, netavark and aardvark-dns (pinned) if missing, save the host's state,
#                                write the engine's configuration
#   devkit/kind/engine.sh down   remove every container, the kind network and its volumes, then restore the host and
#                                check it: iptables (v4 and v6), the sysctls below, links, cgroups, mounts; exit 1
#                                naming anything that is not as it was
#   devkit/kind/engine.sh env    the environment podman and kind need (eval it)
#
# Why not Docker: Debian's dockerd 20.10 gives a --privileged container every capability it knows, and this VM's root
# has no CAP_SYS_RESOURCE in its bounding set, so runc refuses every kind node: "docker: Error response from daemon:
# failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process:
# unable to apply caps: operation not permitted: unknown". Podman gives a privileged container the capabilities of
# its own bounding set. Two more settings follow from the missing capability: the containers' default rlimits are
# lowered to what conmon has (podman lowers its own RLIMIT_NPROC to 32768, and raising one needs CAP_SYS_RESOURCE:
# "crun: setrlimit `RLIMIT_NPROC`: Operation not permitted"), and the runtime is runc (crun 1.8 refuses this hybrid
# cgroup layout: "cgroups in hybrid mode not supported, drop all controllers from cgroupv2").
#
# What the host keeps: its images and containers live under the cache (graph root, so the node image is loaded once
# per pin) and /run/topology-kind; the mounts of its containers are made in the lane's own mount namespace. Before
# anything starts, the host's iptables rules (nft and legacy, v4 and v6), the sysctls netavark or the kind nodes'
# kubelets change (ip_forward, set here first; the kubelet's vm.* and kernel.* defaults, written through the
# privileged nodes' /proc/sys; inotify limits kind asks for) and the list of network links are saved; `down` restores
# and compares them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=devkit/kind/versions.env
. "$here/versions.env"
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
STATE=/run/topology-kind
GRAPH=$cache/kind/podman
LOCK=/tmp/realcluster.lock
SYSCTLS="net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv6.conf.default.forwarding
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables fs.inotify.max_user_instances
fs.inotify.max_user_watches vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
say() { echo "kind-engine: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (rootful podman)"

locked() {  # the caller holds the machine lock (and says so: a lock held by another would pass the first test)
  if flock -n -E 200 "$LOCK" true || [ "${TOPOLOGY_REALCLUSTER_LOCKED:-}" != 1 ]; then
    die "run it under the machine lock: flock $LOCK env TOPOLOGY_REALCLUSTER_LOCKED=1 $0 ${1:-up}"
  fi
}
envs() {
  echo "CONTAINERS_STORAGE_CONF=$STATE/storage.conf"
  echo "CONTAINERS_CONF=$STATE/containers.conf"
  echo "KIND_EXPERIMENTAL_PROVIDER=podman"
}
saves() {  # the host's packet filter as iptables-save prints it, without counters and comments
  local tool
  for tool in iptables-nft-save ip6tables-nft-save iptables-legacy-save ip6tables-legacy-save; do
    command -v "$tool" >/dev/null || continue
    echo "### $tool"
    "$tool" 2>/dev/null | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]$//'
  done
}
links() { ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort; }
sysctls() { local s; for s in $SYSCTLS; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done; }
own_mounts() { awk -v g="$GRAPH" -v s="$STATE" 'index($5, g) == 1 || index($5, s) == 1 {print $5}' /proc/self/mountinfo; }
own_processes() { pgrep -f "$STATE|$GRAPH|aardvark-dns --config" || true; }

up() {
  locked up
  if [ -f "$STATE/up" ]; then say "already up"; return; fi
  local want="podman=$PODMAN_PACKAGE_VERSION netavark=$NETAVARK_PACKAGE_VERSION aardvark-dns=$NETAVARK_PACKAGE_VERSION"
  local have
  have=$(dpkg-query -W -f 'podman=${Version} ' podman 2>/dev/null || true)
  have+=$(dpkg-query -W -f 'netavark=${Version} ' netavark 2>/dev/null || true)
  have+=$(dpkg-query -W -f 'aardvark-dns=${Version}' aardvark-dns 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    say "apt-get install $want"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $want >/dev/null
  fi
  mkdir -p "$STATE/networks" "$GRAPH"
  saves > "$STATE/iptables.before"
  sysctls > "$STATE/sysctl.before"
  links > "$STATE/links.before"
  [ -e /lib/modules ] && : > "$STATE/had-lib-modules"  # kind's bind source: made below if missing, removed after
  # Forwarding on first (the bridge network of the kind nodes needs it; restored by down).
  sysctl -qw net.ipv4.ip_forward=1
  # kind's known issues: too few inotify instances fail kubelets of several nodes.
  [ "$(sysctl -n fs.inotify.max_user_instances)" -ge 512 ] || sysctl -qw fs.inotify.max_user_instances=512
  [ "$(sysctl -n fs.inotify.max_user_watches)" -ge 524288 ] || sysctl -qw fs.inotify.max_user_watches=524288
  mkdir -p /lib/modules
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  cat > "$STATE/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$GRAPH"
runroot = "$STATE/runroot"
EOF
  cat > "$STATE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$STATE/events.log"
runtime = "runc"
tmp_dir = "$STATE/tmp"
volume_path = "$GRAPH/volumes"
[network]
network_backend = "netavark"
network_config_dir = "$STATE/networks"
EOF
  eval "export $(envs | tr '\n' ' ')"
  podman info --format '{{.Host.NetworkBackend}} {{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}' >/dev/null \
    || die "podman info failed (above)"
  : > "$STATE/up"
  say "podman $(podman version --format '{{.Client.Version}}') ready (graph root $GRAPH)"
}

down() {
  locked down
  [ -d "$STATE" ] || { say "not up"; return; }
  eval "export $(envs | tr '\n' ' ')"
  if [ -f "$STATE/containers.conf" ]; then
    podman rm -a -f -t 0 >/dev/null 2>&1 || true
    podman network ls --format '{{.Name}}' 2>/dev/null | grep -qx kind && podman network rm -f kind >/dev/null
    podman volume prune -f >/dev/null 2>&1 || true
  fi
  local problems="" pid d
  for pid in $(own_processes); do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in $(own_processes); do kill -KILL "$pid" 2>/dev/null || true; done
  for d in $(own_mounts | sort -r); do umount "$d" 2>/dev/null || umount -l "$d" || true; done
  [ -z "$(own_mounts)" ] || problems="$problems mounts:$(own_mounts | tr '\n' ' ')"
  # cgroups podman made (empty once its containers are gone), deepest first
  for d in $(find /sys/fs/cgroup/*/libpod_parent -depth -type d 2>/dev/null); do rmdir "$d" 2>/dev/null || true; done
  for d in /sys/fs/cgroup/*/libpod_parent; do [ -d "$d" ] && problems="$problems cgroup:$d"; done
  # links made since up (the kind network's bridge, veths)
  for d in $(comm -13 "$STATE/links.before" <(links)); do ip link del "$d" 2>/dev/null || true; done
  local extra
  extra=$(comm -13 "$STATE/links.before" <(links) | tr '\n' ' ')
  [ -z "$extra" ] || problems="$problems links:$extra"
  # iptables: every table back as saved (iptables-restore replaces each table it names; a table added since is
  # flushed and its chains deleted)
  local tool table
  for tool in iptables-nft ip6tables-nft iptables-legacy ip6tables-legacy; do
    command -v "$tool-save" >/dev/null || continue
    awk -v t="### $tool-save" '$0 == t {on=1; next} /^### / {on=0} on' "$STATE/iptables.before" > "$STATE/$tool.rules"
    for table in $("$tool-save" 2>/dev/null | sed -n 's/^\*//p'); do
      grep -qx "\*$table" "$STATE/$tool.rules" || { "$tool" -t "$table" -F; "$tool" -t "$table" -X; }
    done
    [ -s "$STATE/$tool.rules" ] && "$tool-restore" < "$STATE/$tool.rules"
  done
  # sysctls back
  local line name value
  while IFS= read -r line; do
    name=${line%%=*} value=${line#*=}
    [ "$value" = absent ] && continue
    [ "$(sysctl -n "$name" 2>/dev/null)" = "$value" ] || sysctl -qw "$name=$value" || problems="$problems sysctl:$name"
  done < "$STATE/sysctl.before"
  [ -f "$STATE/had-lib-modules" ] || rmdir /lib/modules 2>/dev/null || true
  [ -f "$STATE/had-lib-modules" ] || [ ! -e /lib/modules ] || problems="$problems /lib/modules-left"
  local after
  after=$(saves)
  if [ "$after" != "$(cat "$STATE/iptables.before")" ]; then
    diff <(cat "$STATE/iptables.before") <(echo "$after") >&2 || true
    problems="$problems iptables"
  fi
  [ -z "$(own_processes)" ] || problems="$problems processes:$(own_processes | tr '\n' ' ')"
  if [ -n "$problems" ]; then
    die "the host is not as it was:$problems (state kept in $STATE)"
  fi
  rm -rf "$STATE"
  say "down; iptables, sysctls, links, cgroups and mounts as before"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) envs ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
