#!/usr/bin/env bash
# The s390x image's grpcio build, run once here without Docker: Dockerfile.s390x's builder step (grpcio compiled from
# the locked sdist against the system OpenSSL and zlib, the locked build backends on PYTHONPATH, no build isolation)
# in a Debian bookworm s390x root under qemu-user-static, then the agent's gRPC tests on that grpcio, on s390x.
#
#   tools/s390x-grpcio-build.sh              # root (cached), build (cached by the sdist's hash), tests
#   GRPCIO_JOBS=1 tools/s390x-grpcio-build.sh
#
#   GRPCIO_CROSS=1 tools/s390x-grpcio-build.sh
#                                            # the same pip command in the same root, but the compiler is the host's
#                                            # x86_64 -> s390x cross gcc 12.2 (Debian g++-s390x-linux-gnu, the root's
#                                            # own gcc version) run natively inside the chroot; python, pip, setup.py
#                                            # and the tests stay s390x under QEMU
#
# Not part of make test or .ci/run: under QEMU the native compile takes many hours (docs/contributing/lanes/s390x.md: the
# rate measured here). It prints the time of each step; the build's own log (every compiler command, with a time
# stamp per line) is in $LOGS.
#
# Environment: GRPCIO_CROSS (1: the cross compiler), GRPCIO_ROOT (default ~/.cache/s390x-topology-agent/grpcio-root), GRPCIO_JOBS (compiler jobs, default
#              nproc), DEBIAN_MIRROR, LOGS (default .tools/s390x-grpcio), TESTS (the test files run on s390x).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/s390x-topology-agent
ROOT=${GRPCIO_ROOT:-$CACHE/grpcio-root}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LOGS=${LOGS:-$REPO/.tools/s390x-grpcio}
JOBS=${GRPCIO_JOBS:-$(nproc)}
TESTS=${TESTS:-tests/integration/test_device_plugin.py tests/devkit/test_kubelet_emulator.py tests/unit/test_proto_contract.py}
MOUNTED=()
mkdir -p "$LOGS"

die() { echo "s390x-grpcio-build: $*" >&2; exit 1; }
cleanup() {
  local i
  for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTED[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root LC_ALL=C.UTF-8 PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 "$@"
}
t0=$SECONDS
stamp() { printf '%5ds  %s\n' $((SECONDS - t0)) "$*"; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -x /usr/bin/qemu-s390x-static ] || die "qemu-user-static is not installed (apt-get install qemu-user-static)"
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-s390x ]; then
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-s390x >/dev/null 2>&1 || update-binfmts --import qemu-s390x >/dev/null 2>&1 || true
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-s390x ] || die "qemu-s390x is not registered in binfmt_misc"

# 1. The root: what the Dockerfile's builder stage has (python 3.11, build-essential, libssl-dev, zlib1g-dev).
if [ ! -f "$ROOT/.grpcio-base-ready" ]; then
  rm -rf --one-file-system "$ROOT"
  mkdir -p "$(dirname "$ROOT")"
  stamp "debootstrap bookworm s390x into $ROOT"
  debootstrap --arch=s390x --variant=minbase \
    --include=python3,python3-venv,python3-pip,python3-dev,build-essential,libssl-dev,zlib1g-dev,ca-certificates \
    bookworm "$ROOT" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 || { tail -n 20 "$LOGS/debootstrap.log"; die "debootstrap failed"; }
  touch "$ROOT/.grpcio-base-ready"
fi
stamp "root ready: $(chroot "$ROOT" uname -m), $(chroot "$ROOT" python3 --version), $(chroot "$ROOT" gcc --version | head -n1)"
# /proc and a /dev of the root's own, never the host's (tools/chroot-mounts.sh)
# shellcheck source=tools/chroot-mounts.sh
. "$REPO/tools/chroot-mounts.sh"
chroot_mounts "$ROOT"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# The host's CA bundle (a registry proxy's CA may be in it only) and pip configuration, as tools/s390x-smoke.sh does.
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
[ -f /etc/pip.conf ] && cp -L /etc/pip.conf "$ROOT/etc/pip.conf"

CROSS_ENV=()
if [ "${GRPCIO_CROSS:-0}" = 1 ]; then
  # The host's cross toolchain inside the root: its binaries (x86_64, run natively: binfmt only catches s390x ones)
  # with the x86_64 libraries they load, gcc's relocated prefix (/opt/hostbin/../lib = /opt/lib -> /usr/lib), and a
  # copy of the cross sysroot whose bin/ names the x86_64 as and ld (the host's are relative links that would land on
  # the root's s390x binutils). Headers and libraries (python3.11, OpenSSL, zlib) are the root's s390x ones.
  for b in s390x-linux-gnu-g++-12 s390x-linux-gnu-gcc-12 s390x-linux-gnu-as s390x-linux-gnu-ld; do
    command -v "$b" >/dev/null || die "GRPCIO_CROSS=1 needs the host's cross compiler: apt-get install g++-s390x-linux-gnu"
  done
  mkdir -p "$ROOT/opt/hostbin" "$ROOT/usr/lib/x86_64-linux-gnu" "$ROOT/usr/lib/gcc-cross" "$ROOT/usr/lib64"
  for pair in /usr/bin:opt/hostbin /usr/lib/x86_64-linux-gnu:usr/lib/x86_64-linux-gnu /usr/lib/gcc-cross:usr/lib/gcc-cross; do
    src=${pair%%:*} dst=$ROOT/${pair#*:}
    if ! mountpoint -q "$dst"; then mount --bind -o ro "$src" "$dst"; MOUNTED+=("$dst"); fi
  done
  [ -e "$ROOT/lib64" ] || ln -s usr/lib64 "$ROOT/lib64"
  ln -sfn /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$ROOT/usr/lib64/ld-linux-x86-64.so.2"
  ln -sfn /usr/lib "$ROOT/opt/lib"
  rm -rf "$ROOT/usr/s390x-linux-gnu" && mkdir -p "$ROOT/usr/s390x-linux-gnu"
  cp -a /usr/s390x-linux-gnu/. "$ROOT/usr/s390x-linux-gnu/"
  for f in "$ROOT"/usr/s390x-linux-gnu/bin/*; do ln -sfn "/opt/hostbin/s390x-linux-gnu-$(basename "$f")" "$f"; done
  ln -sfn /usr/s390x-linux-gnu "$ROOT/opt/s390x-linux-gnu"
  X=/opt/hostbin/s390x-linux-gnu
  CROSS_ENV=(CC="$X-gcc-12" CXX="$X-g++-12" LDSHARED="$X-gcc-12 -shared" LDCXXSHARED="$X-g++-12 -shared"
             AR="$X-ar" CPPFLAGS="-I/usr/include/s390x-linux-gnu" LDFLAGS="-L/usr/lib/s390x-linux-gnu")
  stamp "cross compiler in the root: $(chroot "$ROOT" "$X-g++-12" --version | head -n1)"
fi

# 2. The Dockerfile's step, word for word but for the venv path and the log (see Dockerfile.s390x, builder stage).
mkdir -p "$ROOT/lock"
cp deploy/image/requirements.txt deploy/image/build-requirements.txt "$ROOT/lock/"
sdist_hash=$(sed -n '/^grpcio==/,/^[a-z]/p' deploy/image/requirements.txt | md5sum | cut -c1-12)
if [ -f "$ROOT/opt/venv/.grpcio-built" ] && [ "$(cat "$ROOT/opt/venv/.grpcio-built")" = "$sdist_hash" ]; then
  stamp "grpcio already built for this lock ($sdist_hash): reusing /opt/venv"
else
  rm -rf "$ROOT/opt/venv" "$ROOT/opt/build"
  in_root python3 -m venv /opt/venv
  in_root pip install --quiet --require-hashes --no-deps --only-binary=:all: --target /opt/build \
    -r /lock/build-requirements.txt
  stamp "build backends in /opt/build; compiling grpcio with $JOBS job(s) (log: $LOGS/build.log)"
  b0=$SECONDS
  set +e
  in_root env "${CROSS_ENV[@]}" PYTHONPATH=/opt/build GRPC_PYTHON_BUILD_SYSTEM_OPENSSL=1 GRPC_PYTHON_BUILD_SYSTEM_ZLIB=1 \
      GRPC_PYTHON_BUILD_EXT_COMPILER_JOBS="$JOBS" CFLAGS="-g0" \
      pip install -v --require-hashes --no-deps --ignore-installed --no-build-isolation \
        --only-binary=:all: --no-binary=grpcio -r /lock/requirements.txt 2>&1 \
    | while IFS= read -r line; do printf '%s %s\n' "$(date +%T)" "$line"; done >"$LOGS/build.log"
  rc=${PIPESTATUS[0]}
  set -e
  stamp "grpcio build exit $rc after $((SECONDS - b0)) s ($(grep -c -- ' -c ' "$LOGS/build.log") compiler commands)"
  [ "$rc" = 0 ] || { tail -n 30 "$LOGS/build.log"; die "grpcio build failed (log: $LOGS/build.log)"; }
  if command -v s390x-linux-gnu-strip >/dev/null; then  # the host's cross strip, else the root's own under QEMU
    find "$ROOT/opt/venv" -name 'cygrpc*.so' -exec s390x-linux-gnu-strip --strip-unneeded {} +
  else
    in_root find /opt/venv -name 'cygrpc*.so' -exec strip --strip-unneeded {} +
  fi
  file "$ROOT"/opt/venv/lib/python3.11/site-packages/grpc/_cython/cygrpc*.so
  echo "$sdist_hash" >"$ROOT/opt/venv/.grpcio-built"
  echo "${GRPCIO_CROSS:-0}" >"$ROOT/opt/venv/.grpcio-cross"
fi
in_root python -c 'import grpc, sys; print("grpcio", grpc.__version__, "on", sys.byteorder, "endian")'

# 3. The agent's gRPC tests on s390x with that grpcio.
rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
tar -C "$REPO" --exclude=./.venv --exclude=./.tools --exclude=./.git --exclude=./.cluster --exclude=./.mypy_cache \
  --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis --exclude='*.egg-info' -cf - . \
  | tar -C "$ROOT/src" -xf -
host_pins=$("$REPO/.venv/bin/python" -c 'from importlib import metadata as m; print(" ".join(f"{n}=={m.version(n)}" for n in ("pytest", "hypothesis", "pytest-asyncio")))')
# shellcheck disable=SC2086  # the pin list splits into words on purpose
in_root pip install --quiet --only-binary=:all: $host_pins
stamp "running on s390x: $TESTS"
test_rc=0
# shellcheck disable=SC2086
chroot "$ROOT" /usr/bin/env -i HOME=/root LC_ALL=C.UTF-8 PATH=/opt/venv/bin:/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH=/src:/src/devkit sh -c 'cd /src && exec python -m pytest -q -p no:cacheprovider -o addopts=-ra "$@"' \
  sh $TESTS >"$LOGS/tests.log" 2>&1 || test_rc=$?
tail -n 15 "$LOGS/tests.log"
stamp "tests exit $test_rc"
exit "$test_rc"
