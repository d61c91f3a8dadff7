#!/usr/bin/env bash
# Run checkov on the chart as rendered with its defaults, with every option on, in DRA mode, and "pinned" (the README's image
# digest, the NetworkPolicy, no node labels: the findings configuration can clear), as deploy/helm/README.md
# reports. checkov is not a project dependency: give its binary as CHECKOV, or this installs it into its own
# virtualenv (CHECKOV_VENV, default /tmp/checkov-venv) from PyPI. HELM as for tools/check-chart.sh.
#   deploy/helm/run-checkov.sh            # summary and failed checks of the three renders
#   CHECKOV_VERSION=3.3.30 deploy/helm/run-checkov.sh
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
CHART=deploy/helm/s390x-topology-agent
HELM=${HELM:-}
if [ -z "$HELM" ]; then
  if [ -x .tools/bin/helm ]; then HELM=$REPO/.tools/bin/helm; else HELM=$(command -v helm || tools/get-helm.sh); fi
fi
CHECKOV=${CHECKOV:-}
if [ -z "$CHECKOV" ]; then
  venv=${CHECKOV_VENV:-/tmp/checkov-venv}
  if [ ! -x "$venv/bin/checkov" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "checkov==${CHECKOV_VERSION:-3.3.30}"
  fi
  CHECKOV=$venv/bin/checkov
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/default" "$WORK/all-options" "$WORK/pinned" "$WORK/dra"
COMMON=(template t "$CHART" -n kube-system --kube-version 1.34.0)
"$HELM" "${COMMON[@]}" >"$WORK/default/chart.yaml"
"$HELM" "${COMMON[@]}" \
  --set fakeTopology.enabled=true --set-file "fakeTopology.snapshots.default\.json=agent/data/z16-lpar.json" \
  --set metrics.serviceMonitor.enabled=true --set metrics.allocationsPodNames=true \
  --set seccompProfile.install=true --set kubelet.readState=true --set networkPolicy.enabled=true \
  --set metrics.prometheusRule.enabled=true --set metrics.grafanaDashboard.enabled=true \
  --set-json 'networkPolicy.scraper.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}' \
  --set-json 'networkPolicy.scraper.podSelector={"matchLabels":{"app.kubernetes.io/name":"prometheus"}}' \
  >"$WORK/all-options/chart.yaml"
"$HELM" "${COMMON[@]}" \
  --set image.repository=registry.example.com/z/s390x-topology-agent \
  --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef \
  --set agent.nodeLabels=false --set networkPolicy.enabled=true \
  --set-json 'networkPolicy.scraper.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}' \
  >"$WORK/pinned/chart.yaml"
# DRA mode (docs/admin/modes/dra.md): the DeviceClasses, the plugin directories, the API token it always needs; 1.36 is
# the first Kubernetes with the counters it publishes.
"$HELM" template t "$CHART" -n kube-system --kube-version 1.36.0 --set mode=dra >"$WORK/dra/chart.yaml"

echo "checkov $("$CHECKOV" --version), helm $("$HELM" version --short)"
status=0
for render in default all-options pinned dra; do
  echo "== $render"
  # checkov exits 1 when any check fails; every remaining finding is justified in deploy/helm/README.md.
  # --skip-download: no call to Prisma Cloud for guidelines (the check ids and names are local).
  "$CHECKOV" -d "$WORK/$render" --framework kubernetes --compact --quiet --skip-download ${CHECKOV_ARGS:-} \
    || status=$?
done
exit "$status"
