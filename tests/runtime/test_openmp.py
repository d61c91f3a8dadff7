"""What a container gets, judged by the program that reads it: the real GNU libgomp.

The environment comes from a running agent through the kubelet emulator (Allocate, then the
container start that replays it). Processes started with it load Debian's libgomp1 the way
``import torch`` does (tests/runtime/openmp_probe.py) and report where each of their threads may run.
The node is this machine's own CPUs split into two books, so every CPU named exists here.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.policy.allocation import BINDING_ENV_KEYS, AllocationSettings
from agent.topology.cpulist import parse_cpulist
from agent.topology.model import Cpu, Machine, Topology
from tests.support.env import BOOK, IN_CI
from tests.support.harness import running_node
from topology_devkit.kubelet_emulator import Container

PROBE = Path(__file__).with_name("openmp_probe.py")
LIBGOMP = ctypes.util.find_library("gomp")
MASK = sorted(os.sched_getaffinity(0))  # the container's CPUs: what this process may run on

if LIBGOMP is None:
    if IN_CI:
        pytest.fail("libgomp1 is not installed (.ci/run installs it)", pytrace=False)
    pytestmark = pytest.mark.skip(reason="GNU libgomp (Debian libgomp1) is not installed")
elif len(MASK) < 2:
    pytestmark = pytest.mark.skip(reason=f"needs at least 2 CPUs to tell bound from unbound, this process has {MASK}")


def two_book_topology() -> Topology:
    """This machine's allowed CPUs as an s390x LPAR of two books (one socket each, one thread per core)."""
    half = len(MASK) // 2
    cpus = tuple(Cpu(cpu=n, core=n, socket=0 if i < half else 1, book=0 if i < half else 1, drawer=0,
                     siblings=(n,), polarization="horizontal")
                 for i, n in enumerate(MASK[: 2 * half]))
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    return Topology(machine=machine, cpus=cpus)


def allocate_env(books: int, allocation: AllocationSettings | None = None) -> dict[str, str]:
    """The environment kubelet gives a container that asked for ``books`` books."""
    extra: dict[str, Any] = {"allocation": allocation} if allocation is not None else {}
    with running_node(two_book_topology(), levels=None, **extra) as node:
        node.kubelet.admit_pod("default", "pod", [Container("c", {BOOK: books})])
        return node.kubelet.start_container("default", "pod", "c")


def container_env(allocated: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_", "VLLM_", "LD_PRELOAD"))}
    return {**base, **allocated}


def probe(mode: str, env: dict[str, str], shell: str | None = None) -> dict[str, Any]:
    command = ["sh", "-c", shell, "sh", sys.executable, str(PROBE), mode] if shell else [sys.executable, str(PROBE),
                                                                                       mode]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def processes(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A report and every process below it."""
    yield report
    for key in ("child", "engine_core"):
        if key in report:
            yield from processes(report[key])
    for worker in report.get("workers", []):
        yield from processes(worker)


def ranks(env: dict[str, str]) -> list[list[int]]:
    return [parse_cpulist(r) for r in env["VLLM_CPU_OMP_THREADS_BIND"].split("|")]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-book", "two-books"])
def allocated(request: pytest.FixtureRequest) -> dict[str, str]:
    return allocate_env(request.param)


def test_the_environment_sets_no_binding_variable(allocated: dict[str, str]) -> None:
    assert not set(BINDING_ENV_KEYS) & set(allocated)
    assert allocated["TOPOLOGY_OMP_PLACES"] and allocated["VLLM_CPU_OMP_THREADS_BIND"]


def test_a_process_that_loads_libgomp_keeps_its_cpus_and_so_do_its_children(allocated: dict[str, str]) -> None:
    report = probe("process", container_env(allocated))
    for proc in processes(report):
        assert proc["start"] == MASK
        assert proc["after_load"] == MASK, "libgomp pinned the main thread at load time"
        assert all(t["cpus"] == MASK for t in proc["threads"])
        # OMP_NUM_THREADS binds nothing, but it does cap the threads (no thread per node CPU).
        assert len(proc["threads"]) == int(allocated["OMP_NUM_THREADS"])


@pytest.mark.parametrize("preload", [False, True], ids=["OMP_PLACES-branch", "GOMP_CPU_AFFINITY-branch"])
def test_a_vllm_shaped_tree_puts_rank_r_on_group_r(allocated: dict[str, str], preload: bool) -> None:
    env = container_env(allocated)
    if preload:  # torch's libgomp in LD_PRELOAD: vLLM then writes GOMP_CPU_AFFINITY per rank
        env["LD_PRELOAD"] = LIBGOMP_PATH
    report = probe("vllm-tree", env)
    server, engine = report, report["engine_core"]
    for proc in (server, engine):
        assert proc["start"] == MASK and proc["after_load"] == MASK, "the serving processes must keep the whole set"
    bind = ranks(allocated)
    assert [w["rank"] for w in engine["workers"]] == list(range(len(bind)))
    for worker, cpus in zip(engine["workers"], bind, strict=True):
        if not preload:  # (a preloaded libgomp has bound the worker before its first line of Python)
            assert worker["start"] == MASK  # inherited from EngineCore unchanged
        threads = [t["cpus"] for t in worker["threads"]]
        assert len(threads) == len(cpus)
        assert all(set(t) <= set(cpus) for t in threads), f"rank {worker['rank']} ran outside its group"
        assert set().union(*map(set, threads)) == set(cpus)  # and uses all of it
        assert set(worker["after_load"]) <= set(cpus)


def test_the_old_container_level_openmp_env_breaks_the_same_checks() -> None:
    """What --openmp-env gives (and what every container got before): the checks above must fail."""
    allocated = allocate_env(2, AllocationSettings(openmp_env=True))
    assert allocated["OMP_PLACES"] and allocated["OMP_PROC_BIND"] == "close"
    bind = ranks(allocated)
    first = bind[0][0]
    for preload in (False, True):  # with LD_PRELOAD, the container's OMP_PLACES wins over GOMP_CPU_AFFINITY
        env = {**container_env(allocated), **({"LD_PRELOAD": LIBGOMP_PATH} if preload else {})}
        report = probe("vllm-tree", env)
        assert report["after_load"] == [first], "libgomp pins the API server's main thread to the first place"
        workers = report["engine_core"]["workers"]
        strays = [t["cpus"] for w, cpus in zip(workers, bind, strict=True) for t in w["threads"]
                  if not set(t["cpus"]) <= set(cpus)]
        assert strays, "some rank runs outside its group"


def test_a_single_process_openmp_job_binds_through_the_one_line_wrapper() -> None:
    allocated = allocate_env(2)
    wrapper = 'OMP_PLACES="$TOPOLOGY_OMP_PLACES" OMP_PROC_BIND=close exec "$@"'
    report = probe("leaf", container_env(allocated), shell=wrapper)
    places = [int(p.strip("{}")) for p in allocated["TOPOLOGY_OMP_PLACES"].split(",")]
    assert report["env"]["OMP_PLACES"] == allocated["TOPOLOGY_OMP_PLACES"]
    assert [t["cpus"] for t in report["threads"]] == [[p] for p in places]
    assert len(report["threads"]) == int(allocated["TOPOLOGY_OMP_NUM_THREADS"])


def _libgomp_path() -> str:
    """A path LD_PRELOAD accepts: the file the loader mapped for libgomp."""
    if LIBGOMP is None:
        return ""
    ctypes.CDLL(LIBGOMP)
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            if "libgomp" in line:
                return line.split()[-1]
    return LIBGOMP


LIBGOMP_PATH = _libgomp_path()
