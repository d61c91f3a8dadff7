#!/usr/bin/env bash
# make kind-test: the kind end-to-end lane (needs Docker, kind and kubectl; helm via $HELM, tools/get-helm.sh or PATH).
#
#   1. kind create cluster (1 control plane + 2 workers, tests/e2e/kind.yaml), unless it already exists
#   2. docker build --platform linux/amd64 -f Dockerfile.s390x (the same Dockerfile as the s390x image)
#   3. docker save --platform linux/amd64 to a file, kind load image-archive (not `kind load docker-image`: see below)
#   4. helm upgrade --install in fake-topology mode: <cluster>-worker advertises a z16-shaped snapshot,
#      <cluster>-worker2 a z13-shaped one (tests/e2e/snapshots.py)
#   5. REQUIRE_KIND=1 pytest -m e2e tests/e2e (a skip is a failure here)
#
# Environment: KIND_CLUSTER_NAME (topology-e2e), KIND_NODE_IMAGE (kind's default; Kubernetes >= 1.30 for the
# admission policy test), KEEP_CLUSTER=1 to keep a cluster this script created, TOPOLOGY_E2E_IMAGE
# (s390x-topology-agent:e2e), TOPOLOGY_E2E_NAMESPACE (topology-system), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
CLUSTER=${KIND_CLUSTER_NAME:-topology-e2e}
IMAGE=${TOPOLOGY_E2E_IMAGE:-s390x-topology-agent:e2e}
NAMESPACE=${TOPOLOGY_E2E_NAMESPACE:-topology-system}
RELEASE=topology-agent
CONTEXT=kind-$CLUSTER
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3

die() { echo "kind-test: $*" >&2; exit 1; }
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH (make kind-test needs Docker, kind and kubectl)"
done
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (docker info failed)"
if [ -z "${HELM:-}" ]; then
  if command -v helm >/dev/null; then HELM=$(command -v helm); else HELM=$("$REPO/tools/get-helm.sh"); fi
fi

WORK=$(mktemp -d)
created=0
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    echo "--- diagnostics (exit $rc)"
    kubectl --context "$CONTEXT" get nodes -o wide || true
    kubectl --context "$CONTEXT" get pods -A -o wide || true
    kubectl --context "$CONTEXT" -n "$NAMESPACE" logs -l "app.kubernetes.io/instance=$RELEASE" --tail=100 --prefix || true
  fi
  if [ "$created" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

T0=$SECONDS
echo "==> kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "reusing the existing cluster"
else
  kind create cluster --name "$CLUSTER" --config tests/e2e/kind.yaml ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} \
    --wait 180s
  created=1
fi
kubectl --context "$CONTEXT" version

echo "==> docker build --platform linux/amd64 -f Dockerfile.s390x -t $IMAGE"
DOCKER_BUILDKIT=1 docker build --platform linux/amd64 -f Dockerfile.s390x -t "$IMAGE" \
  --build-arg REVISION="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" .

# Not `kind load docker-image`: it runs a plain `docker save`, and under Docker's containerd image store (the default
# from Docker 29) that archive names every platform of the image's index while only linux/amd64 is present, so the
# node's `ctr images import --all-platforms` stops at the first missing blob ("content digest ... not found",
# kubernetes-sigs/kind#3795, #4066). A single-platform archive loads under either image store; `docker save
# --platform` needs API 1.48 (Docker 28), and older engines only ever save the one platform they hold. The archive
# goes through a file, not /dev/stdin: `kind load image-archive` opens its argument once per node, concurrently
# (pkg/cmd/kind/load/image-archive), so three nodes would split one pipe between them.
api=$(docker version --format '{{.Server.APIVersion}}' 2>/dev/null || echo 0)
save=(docker save)
if printf '%s\n%s\n' 1.48 "$api" | sort -V -C; then save+=(--platform linux/amd64); fi
echo "==> ${save[*]} $IMAGE | kind load image-archive (engine API $api)"
"${save[@]}" --output "$WORK/image.tar" "$IMAGE"
kind load image-archive "$WORK/image.tar" --name "$CLUSTER"
rm -f "$WORK/image.tar"

echo "==> snapshots"
"$PYTHON" tests/e2e/snapshots.py --cluster "$CLUSTER" --out "$WORK/snapshots"

echo "==> helm upgrade --install $RELEASE (fake-topology mode)"
"$HELM" upgrade --install "$RELEASE" deploy/helm/s390x-topology-agent \
  --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
  --set fakeTopology.enabled=true \
  --set-file "fakeTopology.snapshots.default\.json=$WORK/snapshots/default.json" \
  --set-file "fakeTopology.snapshots.${CLUSTER//./\\.}-worker\.json=$WORK/snapshots/$CLUSTER-worker.json" \
  --set-file "fakeTopology.snapshots.${CLUSTER//./\\.}-worker2\.json=$WORK/snapshots/$CLUSTER-worker2.json" \
  --set-json 'nodeSelector={"topology-e2e/worker":"true"}' \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set agent.logFormat=text --set agent.logLevel=debug \
  --wait --timeout 180s

echo "==> pytest -m e2e (REQUIRE_E2E=1)"
export KIND_CLUSTER_NAME=$CLUSTER TOPOLOGY_E2E_NAMESPACE=$NAMESPACE TOPOLOGY_E2E_RELEASE=$RELEASE \
       TOPOLOGY_E2E_IMAGE=$IMAGE TOPOLOGY_E2E_SNAPSHOTS=$WORK/snapshots REQUIRE_E2E=1
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
"$PYTHON" -m pytest -m e2e tests/e2e -v -p no:cacheprovider ${PYTEST_ARGS:-}
echo "kind-test: passed in $((SECONDS - T0)) s"
