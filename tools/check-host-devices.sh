#!/usr/bin/env bash
# The host's device nodes are still what the kernel made them: .ci/run calls it after every stage.
#
#   tools/check-host-devices.sh check STAGE     exit 3 naming STAGE and each broken node, else print nothing
#   tools/check-host-devices.sh watch OUT       poll every second until killed; at the first broken node, write
#                                               the time, the nodes and the processes then running to OUT
#
# Why: once, on a new machine, /dev/null became a plain empty file partway through a CI run (about when the
# stand-in base was first built, with the s390x smoke running beside make test), and every later buildah step
# failed with "/dev/null: Read-only file system". The lanes run root tools against host paths (debootstrap,
# chroot, buildah, qemu-user, runc): a stage that breaks the host must fail by name, not three stages later.
# A broken node is put back (mknod with the kernel's numbers) so that the machine stays usable; CI still fails.
# HOST_DEV (default /dev) is for the tests.
set -euo pipefail
dev=${HOST_DEV:-/dev}
# name major minor: the kernel's numbers (Documentation/admin-guide/devices.txt)
NODES="null 1 3
zero 1 5
full 1 7
random 1 8
urandom 1 9"

broken() {  # prints "path (what it is now)" per broken node
  local name major minor path kind
  while read -r name major minor; do
    path=$dev/$name
    if [ ! -e "$path" ] && [ ! -L "$path" ]; then
      echo "$path (missing)"
    elif [ -L "$path" ] || [ ! -c "$path" ]; then
      kind=$(stat -c %F "$path")
      echo "$path (a $kind, $(stat -c %s "$path") bytes, changed $(stat -c %y "$path"))"
    elif [ "$(stat -c '%t %T' "$path")" != "$(printf '%x %x' "$major" "$minor")" ]; then
      echo "$path (character device $(stat -c '%t:%T' "$path"), not $(printf '%x:%x' "$major" "$minor"))"
    fi
  done <<<"$NODES"
}

restore() {
  local name major minor path
  while read -r name major minor; do
    path=$dev/$name
    if [ ! -c "$path" ] || [ "$(stat -c '%t %T' "$path")" != "$(printf '%x %x' "$major" "$minor")" ]; then
      rm -f "$path" && mknod -m 666 "$path" c "$major" "$minor" || echo "could not restore $path" >&2
    fi
  done <<<"$NODES"
}

case "${1:-}" in
  check)
    stage=${2:?usage: check STAGE}
    found=$(broken)
    [ -z "$found" ] && exit 0
    {
      echo ".ci/run: the host's device nodes are broken after \"$stage\":"
      echo "$found" | sed 's/^/  /'
    } >&2
    restore
    echo ".ci/run: put back with mknod (the kernel's numbers); the stage above broke the host" >&2
    exit 3
    ;;
  watch)
    out=${2:?usage: watch OUT}
    while :; do
      found=$(broken)
      if [ -n "$found" ]; then
        { date -u '+%Y-%m-%dT%H:%M:%SZ first seen broken:'; echo "$found"; echo "processes then:";
          ps -eo pid,ppid,etimes,args --sort=start_time | cut -c1-220; } >"$out"
        exit 0
      fi
      sleep 1
    done
    ;;
  *)
    echo "usage: $0 check STAGE | watch OUT" >&2
    exit 2
    ;;
esac
