# shellcheck shell=bash
# Sourced by the scripts that run programs in a chroot of a Debian root (tools/s390x-smoke.sh,
# tools/s390x-grpcio-build.sh): `chroot_mounts ROOT` mounts /proc and a /dev of the root's own, and appends each
# mount point to the caller's MOUNTED array (the caller unmounts them in reverse on exit).
#
# The root's /dev is a small tmpfs with its own device nodes (mknod, the kernel's numbers), not a bind mount of
# the host's /dev: a program in the chroot (a package script, pip, a test, under qemu-user) that removes or
# replaces /dev/null then changes the root's node, never the host's (lxc/distrobuilder#296 made the same
# change). A mount left by a killed earlier run, the host's /dev bound there included, is undone first.

chroot_mounts() {  # chroot_mounts ROOT
  local root=$1 name major minor
  if mountpoint -q "$root/dev"; then umount -l "$root/dev"; fi
  mount -t tmpfs -o mode=755,nosuid,size=16m chroot-dev "$root/dev"
  MOUNTED+=("$root/dev")
  while read -r name major minor; do
    mknod -m 666 "$root/dev/$name" c "$major" "$minor"
  done <<'NODES'
null 1 3
zero 1 5
full 1 7
random 1 8
urandom 1 9
tty 5 0
NODES
  mkdir -m 755 "$root/dev/pts"
  mkdir -m 1777 "$root/dev/shm"  # POSIX semaphores of multiprocessing
  ln -s /proc/self/fd "$root/dev/fd"
  ln -s /proc/self/fd/0 "$root/dev/stdin"
  ln -s /proc/self/fd/1 "$root/dev/stdout"
  ln -s /proc/self/fd/2 "$root/dev/stderr"
  if ! mountpoint -q "$root/proc"; then
    mount -t proc proc "$root/proc"
    MOUNTED+=("$root/proc")
  fi
}
