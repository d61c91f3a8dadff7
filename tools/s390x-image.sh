#!/usr/bin/env bash
# make image-s390x: the agent's linux/s390x image from Dockerfile.s390x, built here to the end with buildah (no
# registry, no Docker: the base is a debootstrapped s390x stand-in, topology_devkit.realcluster.images), grpcio
# compiled by the host's cross gcc (the Dockerfile's cross-gcc stage), then the image itself run under qemu-user:
#
#   1. `topology-agent discover --format json` on every real s390x dump, byte for byte what this machine's own
#      agent prints for it (big-endian s390x against x86_64);
#   2. the agent's gRPC tests (device plugin against the kubelet emulator) on the image's own Python, grpcio
#      and protobuf, with pytest from PyPI's pure-Python wheels mounted beside.
#
# On success the pins it was built from (sha256 of deploy/image/*requirements.txt) are written to
# deploy/image/s390x-verified.txt, with the minutes it took: .ci/run rebuilds only when the locks differ from that
# record (`tools/s390x-image.sh --if-pins-changed`).
#
# Environment: S390X_IMAGE_CACHE (default ~/.cache/s390x-topology-agent/s390x-image: buildah storage, stand-ins,
# archive; the pip cache with the grpcio wheel is buildah's, /var/tmp/buildah-cache), S390X_FIXTURES.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
CACHE=${S390X_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent/s390x-image}
FIXTURES=${S390X_FIXTURES:-$REPO/../shared/fixtures/s390x-real}
RECORD=deploy/image/s390x-verified.txt
IMAGE=localhost/s390x-topology-agent:e2e-s390x
TESTS="tests/integration/test_device_plugin.py tests/devkit/test_kubelet_emulator.py"
T0=$SECONDS
say() { echo "s390x-image: [$((SECONDS - T0)) s] $*"; }
die() { echo "s390x-image: $*" >&2; exit 1; }
pins=$(cat deploy/image/requirements.txt deploy/image/build-requirements.txt | sha256sum | cut -c1-16)
if [ "${1:-}" = --if-pins-changed ] && [ -f "$RECORD" ] && grep -q "^pins $pins\$" "$RECORD"; then
  echo "s390x-image: the image locks are the ones the last verified s390x build used ($pins, $(grep '^built' "$RECORD"));" \
       "not rebuilt (make image-s390x builds it)"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (buildah, debootstrap)"
[ -e /proc/sys/fs/binfmt_misc/qemu-s390x ] || {
  apt-get install -y -qq --no-install-recommends qemu-user-static binfmt-support >/dev/null
  update-binfmts --enable qemu-s390x >/dev/null 2>&1 || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-s390x ] || die "qemu-s390x is not registered in binfmt_misc"
}

say "buildah bud -f Dockerfile.s390x for linux/s390x (cached layers and pip wheel cache when warm)"
IMAGES_VERBOSE=${IMAGES_VERBOSE:-} "$PYTHON" -m topology_devkit.realcluster.images build-agent --arch s390x --cache "$CACHE"
built=$((SECONDS - T0))
read -r -a B <<<"$("$PYTHON" -c 'import sys; from pathlib import Path; from topology_devkit.realcluster.images import buildah; print(" ".join(buildah(Path(sys.argv[1]))))' "$CACHE")"
c=$("${B[@]}" from --pull=never "$IMAGE")
work=$(mktemp -d)
trap '"${B[@]}" rm "$c" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
arch=$("${B[@]}" inspect --type image --format '{{.OCIv1.Architecture}}' "$IMAGE")
[ "$arch" = s390x ] || die "$IMAGE is $arch, not s390x"
run() { "${B[@]}" run --isolation chroot --user 0:0 "$@"; }

say "1. topology-agent discover on the real dumps, in the image (s390x under qemu) and here ($(uname -m))"
[ -d "$FIXTURES/util-linux" ] || die "no real dumps at $FIXTURES/util-linux (S390X_FIXTURES)"
mkdir -p "$work/s390x" "$work/host"
dumps=0
for dump in "$FIXTURES"/util-linux/*/; do
  name=$(basename "$dump")
  [ -d "$dump/sys" ] || continue
  run -v "$dump:/dump:ro" "$c" -- uname -m > "$work/uname"
  run -v "$dump:/dump:ro" "$c" -- topology-agent discover --host-root /dump --format json > "$work/s390x/$name.json" \
    || die "discover failed in the image on $name"
  PYTHONPATH="$REPO" "$PYTHON" -m agent discover --host-root "$dump" --format json > "$work/host/$name.json"
  dumps=$((dumps + 1))
done
[ "$(cat "$work/uname")" = s390x ] || die "the image ran as $(cat "$work/uname"), not s390x"
diff -r "$work/host" "$work/s390x" || die "discover's JSON differs between the s390x image and this machine"
say "   identical JSON for $dumps dumps; grpcio $(run "$c" -- python -c 'import grpc; print(grpc.__version__)')"

say "2. the gRPC tests on the image's grpcio and protobuf: $TESTS"
deps="$CACHE/pytest-$("$PYTHON" -c 'from importlib import metadata as m; print("-".join(m.version(n) for n in ("pytest", "pluggy", "iniconfig", "packaging", "pygments")))')"
if [ ! -d "$deps" ]; then
  "$REPO/.venv/bin/pip" install --quiet --no-deps --only-binary=:all: --target "$deps.partial" \
    $("$PYTHON" -c 'from importlib import metadata as m; print(" ".join(f"{n}=={m.version(n)}" for n in ("pytest", "pluggy", "iniconfig", "packaging", "pygments")))')
  mv "$deps.partial" "$deps"
fi
# the image's agent (not the work tree's): /src holds the tests and the devkit only
run -v "$REPO/tests:/src/tests:ro" -v "$REPO/devkit:/src/devkit:ro" -v "$REPO/pyproject.toml:/src/pyproject.toml:ro" \
  -v "$deps:/testdeps:ro" --workingdir /src --env PYTHONPATH=/testdeps:/src:/src/devkit --env HOME=/tmp "$c" -- \
  python -m pytest -q -p no:cacheprovider -o addopts=-ra -p no:randomly $TESTS 2>&1 | tail -n 15 | tee "$work/tests.log"
grep -qE '^[0-9]+ passed' "$work/tests.log" && ! grep -qE '[0-9]+ failed' "$work/tests.log" \
  || die "the gRPC tests did not pass on s390x (above)"
total=$((SECONDS - T0))
cold=$( [ -f "$RECORD" ] && grep -q "^pins $pins\$" "$RECORD" && grep '^cold' "$RECORD" || true)
{ printf 'pins %s\nbuilt %s, %d min (image %d min), %s\n' "$pins" "$(date -u +%F)" $((total / 60)) $((built / 60)) \
    "$(nproc) cores $(uname -m)"
  [ -z "$cold" ] || echo "$cold"; } > "$RECORD.tmp"
mv "$RECORD.tmp" "$RECORD"
say "done: $IMAGE, $((total / 60)) min; recorded in $RECORD"
