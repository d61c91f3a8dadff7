#!/usr/bin/env bash
# make e2e: the end-to-end suite against a real single-node cluster on this machine (docs/contributing/lanes/real-cluster.md "A real cluster on
# one machine"). Starts the cluster when it is not up, builds and imports the images (no registry), installs the
# chart with `helm upgrade --install` as a user would (plus devkit/cluster/e2e-values.yaml), then runs
# `pytest -m e2e tests/e2e` with REQUIRE_E2E=1 (a skip is a failure here) and prints each test's result.
#
# E2E_SUITE=vllm (make e2e-vllm): also import the lane's vLLM image (built once per pins and cached:
# devkit/topology_devkit/vllm/) and run the `vllm`-marked tests (tests/e2e/test_vllm*.py) alone;
# by default every e2e test but those.
#
# `e2e.sh soak` (make soak) does the same up to the install, then runs the soak (bench/cluster/soak/run.py) instead
# of the suite: SOAK_SECONDS (1800) of pod churn and seeded faults (SOAK_SEED; random and printed when unset), the
# truth checked every second; its figures also go to $CLUSTER_DIR/soak-<seed>.json.
#
# E2E_PRELOAD_VLLM=1 (.ci/run, with KEEP_CLUSTER=1 before make e2e-vllm): when the vLLM image is built for its pins,
# the main suite imports it into containerd in the background while its tests run (about 90 s of the lane's mostly
# idle CPU), and waits for it before it ends, so that make e2e-vllm finds it there. Its output goes to $CLUSTER_DIR/logs/vllm-preload.log; a
# failed preload fails nothing here (make e2e-vllm imports it again and says why).
#
# RUNTIME=crio (make e2e RUNTIME=crio): the node runs CRI-O 1.34 with Kubernetes 1.34 (devkit/cluster/build.sh crio)
# instead of containerd 2.4 with Kubernetes 1.37; the chart gets CRI-O's socket (devkit/cluster/e2e-values-crio.yaml),
# the suite knows the runtime (TOPOLOGY_E2E_RUNTIME) and DRA mode's tests give way to its refusal on 1.34
# (TOPOLOGY_E2E_DRA=0 unless SKEW=1: the containerd set's Kubernetes 1.37 control plane beside CRI-O's kubelet 1.34).
# A cluster already up with the other runtime is an error (make cluster-down first).
#
# KUBELET_ROOT=/var/lib/k0s/kubelet (at cluster-up; an absolute path ending in /kubelet): kubelet's --root-dir moves
# there, as on k0s or microk8s, and the chart is installed with --set kubelet.root=<it> (docs/admin/kubelet-roots.md).
#
# Environment: RUNTIME (containerd), SKEW, KUBELET_ROOT, E2E_TESTS (the test files or ids to run; tests/e2e), CLUSTER_DIR (.cluster),
# CLUSTER_CACHE, KEEP_CLUSTER=1 (leave a cluster this script started
# running), PYTEST_ARGS (extra pytest arguments), HELM, E2E_SUITE (main or vllm), E2E_PRELOAD_VLLM,
# SOAK_SECONDS, SOAK_SEED, SOAK_QUIET_PODS (8: the quiet run's book pods, for the pod start baseline).
set -euo pipefail
WHAT=${1:-test}
case "$WHAT" in test|soak) ;; *) echo "usage: e2e.sh [test|soak]" >&2; exit 2 ;; esac
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
export CLUSTER_DIR=${CLUSTER_DIR:-$REPO/.cluster}
export PYTHONPATH="$REPO:$REPO/devkit${PYTHONPATH:+:$PYTHONPATH}"
NAMESPACE=topology-system
RELEASE=topology-agent
IMAGE=localhost/s390x-topology-agent:e2e
WORKLOAD=localhost/topology-e2e-busybox:latest
SUITE=${E2E_SUITE:-main}
T0=$SECONDS
die() { echo "e2e: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "the real cluster runs as root"
case "$SUITE" in
  main) MARKS="e2e and not vllm" ;;
  vllm) MARKS="e2e and vllm" ;;
  *) die "E2E_SUITE is main or vllm, not '$SUITE'" ;;
esac
if [ -z "${HELM:-}" ]; then
  if [ -x .tools/bin/helm ]; then HELM=$REPO/.tools/bin/helm
  elif command -v helm >/dev/null; then HELM=$(command -v helm)
  else HELM=$(tools/get-helm.sh); fi
fi
RUNTIME=${RUNTIME:-containerd}
SKEW=${SKEW:-0}
case "$RUNTIME" in
  containerd) RUNTIME_VALUES=(); DRA_DEFAULT=1 ;;
  crio) RUNTIME_VALUES=(-f devkit/cluster/e2e-values-crio.yaml); DRA_DEFAULT=$([ "$SKEW" = 1 ] && echo 1 || echo 0) ;;
  *) die "RUNTIME is containerd or crio, not '$RUNTIME'" ;;
esac
# kubelet's root of the cluster that is up (KUBELET_ROOT at cluster-up), else the one asked for: a root other than
# /var/lib/kubelet goes to the chart as docs/admin/kubelet-roots.md says, --set kubelet.root=<root>.
KUBELET_ROOT=$(cat "$CLUSTER_DIR/kubelet-root" 2>/dev/null || echo "${KUBELET_ROOT:-/var/lib/kubelet}")
export KUBELET_ROOT
ROOT_VALUES=()
[ "$KUBELET_ROOT" = /var/lib/kubelet ] || ROOT_VALUES=(--set "kubelet.root=$KUBELET_ROOT")
BIN=$(devkit/cluster/build.sh "$RUNTIME")
CONTROL_BIN=$BIN
[ "$SKEW" = 1 ] && CONTROL_BIN=$(devkit/cluster/build.sh containerd)
export TOPOLOGY_E2E_KUBECTL=$CONTROL_BIN/kubectl
KUBECONFIG=$CLUSTER_DIR/kubeconfig
export KUBECONFIG
kubectl() { "$CONTROL_BIN/kubectl" "$@"; }

started=0
preload_pid=
if ! "$PYTHON" -m topology_devkit.realcluster status >/dev/null 2>&1; then
  echo "==> cluster-up with $RUNTIME (after cleaning what an earlier cluster may have left on the host)"
  "$PYTHON" -m topology_devkit.realcluster down >/dev/null
  "$PYTHON" -m topology_devkit.realcluster up --runtime "$RUNTIME"
  started=1
elif [ "$(cut -d' ' -f1 "$CLUSTER_DIR/runtime" 2>/dev/null)" != "$RUNTIME" ]; then
  die "the cluster that is up runs $(cut -d' ' -f1 "$CLUSTER_DIR/runtime" 2>/dev/null || echo '?'), not $RUNTIME: make cluster-down first"
else
  echo "==> cluster already up; importing the images again"
  "$PYTHON" -m topology_devkit.realcluster images
fi
cleanup() {
  local rc=$?
  if [ -n "$preload_pid" ]; then kill "$preload_pid" 2>/dev/null || true; wait "$preload_pid" 2>/dev/null || true; fi
  if [ "$rc" != 0 ]; then
    echo "--- diagnostics (exit $rc)"
    kubectl get nodes -o wide || true
    kubectl get pods -A -o wide || true
    kubectl -n "$NAMESPACE" logs -l "app.kubernetes.io/instance=$RELEASE" --tail=60 --prefix || true
    tail -n 20 "$CLUSTER_DIR/logs/kubelet.log" || true
  fi
  if [ "$started" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then "$PYTHON" -m topology_devkit.realcluster down || true; fi
}
trap cleanup EXIT

NODE=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
kubectl label node "$NODE" topology-e2e/worker=true --overwrite >/dev/null
SNAPSHOTS=$CLUSTER_DIR/snapshots
"$PYTHON" tests/e2e/snapshots.py --local-cpus "$(nproc)" --out "$SNAPSHOTS"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null

echo "==> helm upgrade --install $RELEASE (fake topology: one book per CPU of this machine)"
"$HELM" upgrade --install "$RELEASE" deploy/helm/s390x-topology-agent --namespace "$NAMESPACE" \
  -f devkit/cluster/e2e-values.yaml "${RUNTIME_VALUES[@]}" "${ROOT_VALUES[@]}" \
  --set-file "fakeTopology.snapshots.default\.json=$SNAPSHOTS/default.json" --wait --timeout 180s

if [ "$SUITE" = main ] && [ "$WHAT" = test ] && [ "${E2E_PRELOAD_VLLM:-0}" = 1 ]; then
  vllm_archive=$("$PYTHON" -m topology_devkit.vllm.image key | cut -f2)
  if [ -f "$vllm_archive" ]; then
    echo "==> the vLLM image into $RUNTIME in the background, for make e2e-vllm ($CLUSTER_DIR/logs/vllm-preload.log)"
    "$PYTHON" -m topology_devkit.realcluster vllm-image >"$CLUSTER_DIR/logs/vllm-preload.log" 2>&1 &
    preload_pid=$!
    preload_t=$SECONDS
  else  # a build (about 10 minutes of both CPUs) would load the suite: make e2e-vllm builds it after
    echo "==> the vLLM image is not built for these pins yet: make e2e-vllm builds and imports it"
  fi
fi

if [ "$SUITE" = vllm ]; then
  echo "==> the vLLM image into $RUNTIME (built once per pins, then cached)"
  t=$SECONDS
  "$PYTHON" -m topology_devkit.realcluster vllm-image
  echo "e2e: vLLM image ready in $RUNTIME after $((SECONDS - t)) s"
fi

if [ "$WHAT" = soak ]; then
  SOAK_SEED=${SOAK_SEED:-$((RANDOM % 1000))}
  echo "==> soak: ${SOAK_SECONDS:-1800} s, seed $SOAK_SEED"
  "$PYTHON" -m bench.cluster.soak.run --seconds "${SOAK_SECONDS:-1800}" --seed "$SOAK_SEED" --kubeconfig "$KUBECONFIG" \
    --namespace "$NAMESPACE" --release "$RELEASE" --helm "$HELM" --snapshots "$SNAPSHOTS" \
    --workload-image "$WORKLOAD" --quiet-pods "${SOAK_QUIET_PODS:-8}" --report "$CLUSTER_DIR/soak-$SOAK_SEED.json"
  echo "soak: done in $((SECONDS - T0)) s"
  exit 0
fi

echo "==> pytest -m '$MARKS' tests/e2e (REQUIRE_E2E=1)"
export TOPOLOGY_E2E_KUBECONFIG=$KUBECONFIG TOPOLOGY_E2E_LANE=local TOPOLOGY_E2E_NAMESPACE=$NAMESPACE \
       TOPOLOGY_E2E_RELEASE=$RELEASE TOPOLOGY_E2E_IMAGE=$IMAGE TOPOLOGY_E2E_WORKLOAD_IMAGE=$WORKLOAD \
       TOPOLOGY_E2E_SNAPSHOTS=$SNAPSHOTS TOPOLOGY_E2E_HELM=$HELM REQUIRE_E2E=1 \
       TOPOLOGY_E2E_DRA=${TOPOLOGY_E2E_DRA:-$DRA_DEFAULT} TOPOLOGY_E2E_VLLM_IMAGE=localhost/topology-e2e-vllm:0.32.0 \
       TOPOLOGY_E2E_RUNTIME=$RUNTIME TOPOLOGY_E2E_KUBELET_ROOT=$KUBELET_ROOT
# shellcheck disable=SC2086  # E2E_TESTS and PYTEST_ARGS are lists of words
"$PYTHON" -m pytest -m "$MARKS" ${E2E_TESTS:-tests/e2e} -v -rA --durations=12 -p no:cacheprovider ${PYTEST_ARGS:-}
if [ -n "$preload_pid" ]; then
  preload_rc=0
  wait "$preload_pid" || preload_rc=$?
  preload_pid=
  if [ "$preload_rc" = 0 ]; then
    echo "e2e: the vLLM image preloaded in the background (done $((SECONDS - preload_t)) s after it began)"
  else
    echo "e2e: the vLLM image preload failed (exit $preload_rc; make e2e-vllm imports it again):" >&2
    tail -n 5 "$CLUSTER_DIR/logs/vllm-preload.log" >&2 || true
  fi
fi
echo "e2e ($SUITE, $RUNTIME): passed in $((SECONDS - T0)) s"
