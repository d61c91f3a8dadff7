#!/usr/bin/env bash
# make kind-test: the kind end-to-end lane, everything built and started here (no registry, no Docker Hub):
#
#   1. builds (cached by pin, outside the clone): the real-cluster lane's binaries (devkit/cluster/build.sh), kind
#      and kubeadm (devkit/kind/build.sh), the agent's linux/amd64 image from Dockerfile.s390x with buildah and the
#      test workload's (topology_devkit.realcluster.images), the kind node image (devkit/kind/node-image.sh)
#   2. under the machine lock (flock /tmp/realcluster.lock; taken here after the builds) and in a mount namespace of
#      its own (unshare: the nodes' mounts never reach the host's table): rootful Podman from Debian, kind's other
#      provider (devkit/kind/engine.sh up, which saves the host's iptables, sysctls and links first; it says why not
#      Docker)
#   3. kind create cluster (devkit/kind/kind.yaml: 1 control plane + 2 workers), each node's bridge CNI config and
#      routes to the others' pod CIDRs (what kindnetd does), every node Ready
#   4. kind load image-archive: the agent and the workload image
#   5. helm upgrade --install in fake-topology mode: <cluster>-worker advertises a z16-shaped snapshot,
#      <cluster>-worker2 a z13-shaped one (tests/e2e/snapshots.py)
#   6. REQUIRE_E2E=1 pytest -m e2e on the kind lane (a skip is a failure; KIND_TESTS picks the files)
#   7. kind delete cluster, engine down: the host's iptables, sysctls, links, cgroups and mounts back and checked
#
# Environment: KIND_CLUSTER_NAME (topology-e2e), KIND_TESTS (the test files; default the multi-node tests and the
# shared suite), PYTEST_ARGS, HELM.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
LOCK=/tmp/realcluster.lock
CLUSTER=${KIND_CLUSTER_NAME:-topology-e2e}
NAMESPACE=topology-system
RELEASE=topology-agent
IMAGE=localhost/s390x-topology-agent:e2e
WORKLOAD=localhost/topology-e2e-busybox:latest
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
export PYTHONPATH="$REPO:$REPO/devkit${PYTHONPATH:+:$PYTHONPATH}"
KIND_TESTS=${KIND_TESTS:-tests/e2e/test_multinode.py tests/e2e/test_e2e.py}
T0=$SECONDS
die() { echo "kind-test: $*" >&2; exit 1; }
stamp() { echo "==> [$((SECONDS - T0)) s] $*"; }
[ "$(id -u)" = 0 ] || die "the kind lane runs as root (rootful podman, buildah)"
if [ -z "${HELM:-}" ]; then
  if [ -x .tools/bin/helm ]; then HELM=$REPO/.tools/bin/helm
  elif command -v helm >/dev/null; then HELM=$(command -v helm)
  else HELM=$(tools/get-helm.sh); fi
fi

stamp "builds (cached by pin)"
BIN=$(devkit/cluster/build.sh)
KIND=$(devkit/kind/build.sh)/kind
export TOPOLOGY_E2E_KUBECTL=$BIN/kubectl
archives=$("$PYTHON" -m topology_devkit.realcluster.images build | cut -f1,2)
agent_archive=$(awk -v i="$IMAGE" '$1 == i {print $2}' <<<"$archives")
workload_archive=$(awk -v i="$WORKLOAD" '$1 == i {print $2}' <<<"$archives")
[ -f "$agent_archive" ] && [ -f "$workload_archive" ] || die "the image build printed no archives: $archives"
NODE_IMAGE_LOAD=0 PYTHON=$PYTHON devkit/kind/node-image.sh >/dev/null
if [ "${TOPOLOGY_REALCLUSTER_LOCKED:-}" != 1 ]; then
  # The rest starts a cluster: under the machine lock, held until the host is back as it was, and in a mount
  # namespace of its own. (Run again there; the builds above are cached, a few seconds.)
  stamp "waiting for the machine lock ($LOCK)"
  TOPOLOGY_REALCLUSTER_LOCKED=1 exec flock "$LOCK" unshare --mount --propagation private "$0" "$@"
fi

WORK=$(mktemp -d)
export KUBECONFIG=$WORK/kubeconfig
kubectl() { "$BIN/kubectl" "$@"; }
engine_started=0
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "$engine_started" = 1 ]; then
    echo "--- diagnostics (exit $rc)"
    if [ -s "$KUBECONFIG" ]; then
      kubectl get nodes -o wide || true
      kubectl get pods -A -o wide || true
      kubectl -n "$NAMESPACE" logs -l "app.kubernetes.io/instance=$RELEASE" --tail=60 --prefix || true
    fi
    for n in $(podman ps -a --format '{{.Names}}' 2>/dev/null); do
      echo "--- $n: podman logs (tail), kubelet and containerd journal (tail)"
      podman logs --tail 15 "$n" 2>&1 || true
      podman exec "$n" journalctl -u kubelet -u containerd -u topology-preload --no-pager -n 25 2>&1 || true
    done
  fi
  if [ "$engine_started" = 1 ]; then
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    devkit/kind/engine.sh down || rc=1
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

stamp "podman (devkit/kind/engine.sh up)"
engine_started=1
devkit/kind/engine.sh up
eval "export $(devkit/kind/engine.sh env | tr '\n' ' ')"
NODE_IMAGE=$(PYTHON=$PYTHON devkit/kind/node-image.sh)

stamp "kind create cluster $CLUSTER ($NODE_IMAGE)"
"$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
"$KIND" create cluster --name "$CLUSTER" --config devkit/kind/kind.yaml --image "$NODE_IMAGE" --kubeconfig "$KUBECONFIG" \
  --retain
NODES=$("$KIND" get nodes --name "$CLUSTER" | sort)
CONTROL_PLANE=$CLUSTER-control-plane
node_ip() { podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }

stamp "pod network: a bridge per node on its pod CIDR, routes to the others' (what kindnetd does)"
for n in $NODES; do
  cidr=""
  for _ in $(seq 1 120); do
    cidr=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
    [ -n "$cidr" ] && break
    sleep 1
  done
  [ -n "$cidr" ] || die "node $n has no pod CIDR (kube-controller-manager's node IPAM)"
  eval "CIDR_${n//-/_}=$cidr"
done
for n in $NODES; do
  var=CIDR_${n//-/_}
  conf=$("$PYTHON" -c 'import json, sys; print(json.dumps({"cniVersion": "1.0.0", "name": "topology-kind", "plugins": [
    {"type": "bridge", "bridge": "kindbr0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": sys.argv[1]}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": True}}, {"type": "loopback"}]}, indent=1))' "${!var}")
  podman exec -i "$n" sh -c 'mkdir -p /etc/cni/net.d && cat > /etc/cni/net.d/10-topology-kind.conflist' <<<"$conf"
  for other in $NODES; do
    [ "$other" = "$n" ] && continue
    ovar=CIDR_${other//-/_}
    podman exec "$n" ip route replace "${!ovar}" via "$(node_ip "$other")"
  done
done
kubectl wait --for=condition=Ready node --all --timeout=180s

stamp "kind load image-archive: $IMAGE, $WORKLOAD"
"$KIND" load image-archive "$agent_archive" --name "$CLUSTER"
"$KIND" load image-archive "$workload_archive" --name "$CLUSTER"

stamp "snapshots and helm upgrade --install $RELEASE"
SNAPSHOTS=$WORK/snapshots
"$PYTHON" tests/e2e/snapshots.py --cluster "$CLUSTER" --out "$SNAPSHOTS"
VALUES=$WORK/values.yaml
"$PYTHON" - "$SNAPSHOTS" "$CLUSTER" "$(node_ip "$CONTROL_PLANE")" > "$VALUES" <<'PY'
import json, sys
from pathlib import Path
snapshots, cluster, apiserver = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
values = {
    "image": {"repository": "localhost/s390x-topology-agent", "tag": "e2e", "pullPolicy": "Never"},
    "nodeSelector": {"topology-e2e/worker": "true"},
    "fakeTopology": {"enabled": True, "snapshots": {p.name: p.read_text() for p in sorted(snapshots.glob("*.json"))}},
    # the snapshots' CPUs (0-81 on the z16-shaped node) are not these x86 nodes' CPUs: a cpuset of them would be
    # refused by runc, so nothing is pinned here (the one-node lane maps its fake books to real CPUs and pins them)
    "cpusetEnforcement": "none",
    "agent": {"logFormat": "text", "logLevel": "debug", "extraEnv": [
        # no kube-proxy in the kind lane: the API server at the control plane's own address
        {"name": "KUBERNETES_SERVICE_HOST", "value": apiserver},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]},
    "resources": {"requests": {"cpu": "0", "memory": "96Mi"}, "limits": {"memory": "256Mi"}},
    "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 1, "timeoutSeconds": 3, "failureThreshold": 3},
}
print(json.dumps(values, indent=1))
PY
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null
"$HELM" upgrade --install "$RELEASE" deploy/helm/s390x-topology-agent --namespace "$NAMESPACE" -f "$VALUES" \
  --wait --timeout 180s

stamp "pytest -m e2e (kind lane, REQUIRE_E2E=1): $KIND_TESTS"
export TOPOLOGY_E2E_KUBECONFIG=$KUBECONFIG TOPOLOGY_E2E_LANE=kind TOPOLOGY_E2E_ENGINE=podman KIND_CLUSTER_NAME=$CLUSTER \
       TOPOLOGY_E2E_NAMESPACE=$NAMESPACE TOPOLOGY_E2E_RELEASE=$RELEASE TOPOLOGY_E2E_IMAGE=$IMAGE \
       TOPOLOGY_E2E_WORKLOAD_IMAGE=$WORKLOAD TOPOLOGY_E2E_SNAPSHOTS=$SNAPSHOTS TOPOLOGY_E2E_HELM=$HELM \
       TOPOLOGY_E2E_VALUES=$VALUES REQUIRE_E2E=1 REQUIRE_MULTINODE=1
# shellcheck disable=SC2086  # lists of words
"$PYTHON" -m pytest -m e2e $KIND_TESTS -v -rA --durations=12 -p no:cacheprovider ${PYTEST_ARGS:-}
stamp "kind-test: passed"
