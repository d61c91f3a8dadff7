"""The shipped seccomp profile judged by its real consumers: containerd loads it as a Localhost profile,
runc and crun compile it with libseccomp, and a process in the container makes the NUMA calls vLLM's
memory binding makes. Under RuntimeDefault the same calls are refused (EPERM): the test can fail.

The probe is a small static C program (this machine's gcc and libc.a), bind-mounted into the
container; the profile is the one for this machine's architecture.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent.node import seccomp
from tests.support.env import missing
from topology_devkit.containerd import Containerd

PROBE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Each NUMA call vLLM's memory binding makes; exit 0 when none is refused by seccomp (EPERM). */
int main(void) {
    unsigned long mask = 1, maxnode = sizeof(mask) * 8;
    int mode = 0, refused = 0;
    struct { const char *name; long rc; } calls[] = {
        {"get_mempolicy", syscall(SYS_get_mempolicy, &mode, NULL, 0, NULL, 0)},
        {"set_mempolicy", syscall(SYS_set_mempolicy, 0 /* MPOL_DEFAULT */, NULL, 0)},
        {"mbind", syscall(SYS_mbind, NULL, 0, 0, NULL, 0, 0)},
        {"migrate_pages", syscall(SYS_migrate_pages, 0, maxnode, &mask, &mask)},
        {"move_pages", syscall(SYS_move_pages, 0, 0, NULL, NULL, NULL, 0)},
    };
    for (unsigned i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        int err = calls[i].rc < 0 ? errno : 0;
        printf("%s %ld %s\n", calls[i].name, calls[i].rc, err ? strerror(err) : "ok");
        if (err == EPERM) refused++;
    }
    return refused;
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        missing("gcc", "apt-get install gcc libc6-dev")
    out = tmp_path_factory.mktemp("numa-probe")
    (out / "probe.c").write_text(PROBE_C)
    build = subprocess.run(["gcc", "-static", "-O1", "-o", str(out / "numa-probe"), str(out / "probe.c")],
                           capture_output=True, text=True, check=False)
    if build.returncode != 0:
        missing("a static C toolchain (gcc, libc.a)", build.stderr.strip()[-300:])
    return out



def test_the_profile_lets_the_numa_calls_through_where_runtime_default_refuses_them(
        ctd: Containerd, probe: Path, handler: str) -> None:
    profile = probe / seccomp.PROFILE_NAME
    profile.write_bytes(seccomp.profile(seccomp.node_arch()))
    mounts = ((str(probe), "/probe"),)
    ours = ctd.run_pod("numa-ours", handler=handler, command=("/probe/numa-probe",), mounts=mounts,
                       seccomp=str(profile))
    default = ctd.run_pod("numa-default", handler=handler, command=("/probe/numa-probe",), mounts=mounts,
                          seccomp="runtime/default")
    try:
        assert ctd.wait_exited(ours.container_id) == 0  # no NUMA call refused under vllm-numa.json
        assert ctd.wait_exited(default.container_id) == 5  # RuntimeDefault refuses all five without SYS_NICE
    finally:
        ctd.remove_pod(ours)
        ctd.remove_pod(default)
