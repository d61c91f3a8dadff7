#!/usr/bin/env bash
# The kind lane's container engine: Debian's dockerd (docker.io), started and stopped by the lane itself, and the
# host put back as it was. Run it under the machine lock (flock /tmp/realcluster.lock): the real-cluster lane uses
# the same kernel, bridge netfilter and iptables.
#
#   devkit/kind/engine.sh up     install docker.io (pinned) if missing, snapshot the host, start dockerd
#   devkit/kind/engine.sh down   remove every container and the kind network, stop dockerd, then restore the host
#                                and check it: iptables (v4 and v6), the sysctls below, links, cgroups; exit 1 naming
#                                anything that is not as it was
#   devkit/kind/engine.sh env    print DOCKER_HOST for the lane's engine
#
# What the host keeps: dockerd runs in a mount namespace of its own (unshare --mount, private propagation), so its
# overlay mounts, its containers' /dev and /sys and their volumes never appear in the host's mount table; its data
# root (images, so the node image is loaded once) is under the cache, outside the clone. Before it starts, the host's
# iptables rules (nft and legacy, v4 and v6), the sysctls it or the kind nodes' kubelets change (ip_forward: dockerd
# sets the FORWARD policy to DROP when it has to enable forwarding itself, which would cut the real-cluster lane's
# bridge; the kubelet's vm.* and kernel.* defaults, written through the privileged nodes' /proc/sys; inotify limits
# kind asks for) and the list of network links are saved; `down` restores them and compares.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=devkit/kind/versions.env
. "$here/versions.env"
cache=${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/cluster}
STATE=/run/topology-kind
SOCK=$STATE/docker.sock
DATA=$cache/kind/docker
LOCK=/tmp/realcluster.lock
SYSCTLS="net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv6.conf.default.forwarding
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables fs.inotify.max_user_instances
fs.inotify.max_user_watches vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
say() { echo "kind-engine: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (dockerd)"

locked() {  # the caller holds the machine lock (and says so: a lock held by another would pass the first test)
  if flock -n -E 200 "$LOCK" true || [ "${TOPOLOGY_REALCLUSTER_LOCKED:-}" != 1 ]; then
    die "run it under the machine lock: flock $LOCK env TOPOLOGY_REALCLUSTER_LOCKED=1 $0 ${1:-up}"
  fi
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

up() {
  locked
  if [ -S "$SOCK" ] && DOCKER_HOST=unix://$SOCK docker info >/dev/null 2>&1; then say "already up"; return; fi
  if ! command -v dockerd >/dev/null || [ "$(dpkg-query -W -f '${Version}' docker.io 2>/dev/null)" != "$DOCKER_PACKAGE_VERSION" ]; then
    say "apt-get install docker.io=$DOCKER_PACKAGE_VERSION (not started by the package: policy-rc.d)"
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; made_policy=1; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "docker.io=$DOCKER_PACKAGE_VERSION" >/dev/null
    [ "$made_policy" = 1 ] && rm -f "$policy"
  fi
  mkdir -p "$STATE" "$DATA"
  saves > "$STATE/iptables.before"
  sysctls > "$STATE/sysctl.before"
  links > "$STATE/links.before"
  [ -d /run/containerd ] && : > "$STATE/had-run-containerd"
  # kind mounts /lib/modules into every node; dockerd makes a missing bind source (this VM has none): removed again
  [ -e /lib/modules ] && : > "$STATE/had-lib-modules"
  # Forwarding on before dockerd starts: it then leaves the FORWARD policy alone (moby libnetwork#1526).
  sysctl -qw net.ipv4.ip_forward=1
  # kind's known issues: too few inotify instances fail kubelets of several nodes.
  [ "$(sysctl -n fs.inotify.max_user_instances)" -ge 512 ] || sysctl -qw fs.inotify.max_user_instances=512
  [ "$(sysctl -n fs.inotify.max_user_watches)" -ge 524288 ] || sysctl -qw fs.inotify.max_user_watches=524288
  mkdir -p /run/containerd
  # Its own mount namespace; /run/containerd hidden behind a tmpfs there: dockerd uses a containerd socket it finds
  # at /run/containerd/containerd.sock (the real-cluster lane's) instead of starting its own.
  unshare --mount --propagation private sh -c '
    mount -t tmpfs -o mode=711,size=1m topology-kind-hide /run/containerd
    exec dockerd --data-root "$1" --exec-root "$2/exec" --pidfile "$2/dockerd.pid" -H "unix://$3" \
      --bridge none --storage-driver overlay2 --log-level warn' sh "$DATA" "$STATE" "$SOCK" \
    > "$STATE/dockerd.log" 2>&1 &
  local i
  for i in $(seq 1 120); do
    if DOCKER_HOST=unix://$SOCK docker version >/dev/null 2>&1; then
      say "dockerd $(DOCKER_HOST=unix://$SOCK docker version --format '{{.Server.Version}}') up ($SOCK)"
      return
    fi
    if [ "$i" -gt 5 ] && ! pgrep -f "dockerd --data-root $DATA" >/dev/null; then break; fi
    sleep 0.5
  done
  tail -n 20 "$STATE/dockerd.log" >&2
  die "dockerd did not come up (log above: $STATE/dockerd.log)"
}

down() {
  locked
  [ -d "$STATE" ] || { say "not up"; return; }
  export DOCKER_HOST=unix://$SOCK
  if docker info >/dev/null 2>&1; then
    local ids
    ids=$(docker ps -aq)
    [ -z "$ids" ] || docker rm -f -v $ids >/dev/null
    docker network ls --format '{{.Name}}' | grep -qx kind && docker network rm kind >/dev/null
  fi
  local pid
  pid=$(cat "$STATE/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { say "dockerd $pid did not stop: SIGKILL"; kill -KILL "$pid"; }
  fi
  # its containerd and shims (they carry the exec root in their arguments)
  for pid in $(pgrep -f "$STATE/exec" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  local problems=""
  # cgroups dockerd made (empty once its containers are gone), deepest first
  local d
  for d in $(find /sys/fs/cgroup/*/docker -depth -type d 2>/dev/null); do rmdir "$d" 2>/dev/null || true; done
  for d in /sys/fs/cgroup/*/docker; do [ -d "$d" ] && problems="$problems cgroup:$d"; done
  # links made since up (the kind network's bridge, veths)
  for d in $(comm -13 "$STATE/links.before" <(links)); do ip link del "$d" 2>/dev/null || true; done
  local extra
  extra=$(comm -13 "$STATE/links.before" <(links) | tr '\n' ' ')
  [ -z "$extra" ] || problems="$problems links:$extra"
  # iptables: every table back as saved (iptables-restore replaces each table it names; a table dockerd added is
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
  [ -f "$STATE/had-run-containerd" ] || rmdir /run/containerd 2>/dev/null || true
  [ -f "$STATE/had-lib-modules" ] || rmdir /lib/modules 2>/dev/null || true
  [ -f "$STATE/had-lib-modules" ] || [ ! -e /lib/modules ] || problems="$problems /lib/modules-left"
  local after
  after=$(saves)
  if [ "$after" != "$(cat "$STATE/iptables.before")" ]; then
    diff <(cat "$STATE/iptables.before") <(echo "$after") >&2 || true
    problems="$problems iptables"
  fi
  pgrep -f "dockerd --data-root $DATA" >/dev/null && problems="$problems dockerd-running"
  if [ -n "$problems" ]; then
    die "the host is not as it was:$problems (state kept in $STATE)"
  fi
  rm -rf "$STATE"
  say "down; iptables, sysctls, links and cgroups as before"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "DOCKER_HOST=unix://$SOCK" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
