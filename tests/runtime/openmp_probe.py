"""A process that loads the real GNU libgomp the way ``import torch`` does and reports where its
threads may run. Run as a script by tests/runtime/test_openmp.py; prints one JSON document.

    python openmp_probe.py process        # one process: load libgomp, run a parallel region, start one child
    python openmp_probe.py vllm-tree      # API server -> EngineCore -> one worker per rank, as vLLM starts them

libgomp reads its environment in a constructor when the library is loaded (``initialize_env`` in
``libgomp/env.c``); with binding on (``OMP_PLACES``, ``OMP_PROC_BIND`` or ``GOMP_CPU_AFFINITY``) it pins
the loading thread to the first place at that moment (``gomp_init_affinity`` in
``libgomp/config/linux/affinity.c``). ``ctypes.CDLL`` loads it as the dynamic loader does for
``libtorch_cpu.so``, or ``LD_PRELOAD`` loads it at exec. The parallel region is entered through
libgomp's own ABI (``GOMP_parallel``) with a Python callback, so every OpenMP thread reports its own
``sched_getaffinity``.

The vLLM-shaped tree follows vLLM's CPU backend (``vllm/utils/ompmultiprocessing.py``,
``OMPProcessManager``; ``../shared/docs/s390x-topology.md`` C.2): the API server and EngineCore run
with the container's environment; each worker process gets, from ``VLLM_CPU_OMP_THREADS_BIND``'s
list for its rank, ``OMP_NUM_THREADS`` and, when ``LD_PRELOAD`` names libgomp,
``GOMP_CPU_AFFINITY="c0 c1 ..."``, else ``OMP_PLACES="{c0,c1,...}"`` with ``OMP_PROC_BIND=true``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from typing import Any

LIBGOMP = "libgomp.so.1"
TOUCHED_BY_VLLM = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")


def affinity() -> list[int]:
    """The calling thread's allowed CPUs (sched_getaffinity(0) is per thread on Linux)."""
    return sorted(os.sched_getaffinity(0))


def load_libgomp() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("gomp") or LIBGOMP)


def parallel_region(gomp: ctypes.CDLL) -> list[dict[str, Any]]:
    """Each OpenMP thread's number and allowed CPUs, from inside a real parallel region."""
    seen: dict[int, list[int]] = {}
    gomp.omp_get_thread_num.restype = ctypes.c_int
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def body(_data: int | None) -> None:
        seen[gomp.omp_get_thread_num()] = affinity()

    callback = callback_type(body)
    # void GOMP_parallel (void (*fn) (void *), void *data, unsigned num_threads, unsigned flags):
    # num_threads 0 takes nthreads-var (OMP_NUM_THREADS, else one per CPU of the process).
    gomp.GOMP_parallel.argtypes = [callback_type, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp.GOMP_parallel(callback, None, 0, 0)
    return [{"thread": n, "cpus": seen[n]} for n in sorted(seen)]


def run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    if out.returncode != 0:
        return {"error": f"{args}: exit {out.returncode}: {out.stderr.strip()[-2000:]}"}
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def process_report(children: bool) -> dict[str, Any]:
    """Where this process may run before and after loading libgomp, and its OpenMP threads."""
    start = affinity()
    gomp = load_libgomp()
    report: dict[str, Any] = {"start": start, "after_load": affinity(), "threads": parallel_region(gomp),
                              "env": {k: os.environ[k] for k in TOUCHED_BY_VLLM if k in os.environ}}
    if children:
        report["child"] = run_child(["leaf"])  # inherits this process's mask, as multiprocessing does
    return report


def vllm_parse_id_list(text: str) -> list[int]:
    """vLLM's cpu_resource_utils.parse_id_list: ints and inclusive a-b ranges, deduplicated and sorted."""
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return sorted(ids)


def rank_env(cpus: list[int]) -> dict[str, str]:
    """The variables vLLM's OMPProcessManager writes into one rank's worker process."""
    env = {"OMP_NUM_THREADS": str(len(cpus))}
    preload = os.environ.get("LD_PRELOAD", "")
    if "libgomp" in preload:
        env["GOMP_CPU_AFFINITY"] = " ".join(map(str, cpus))
    elif "libiomp" not in preload and "libomp" not in preload:
        env["OMP_PLACES"] = "{" + ",".join(map(str, cpus)) + "}"
        env["OMP_PROC_BIND"] = "true"
    return env


def engine_core() -> dict[str, Any]:
    """EngineCore: imports torch (loads libgomp), then starts one worker per rank."""
    report = process_report(children=False)
    binding = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    workers = []
    for rank, text in enumerate(binding.split("|") if binding else []):
        env = {**os.environ, **rank_env(vllm_parse_id_list(text))}
        worker = run_child(["leaf"], env)
        worker["rank"] = rank
        worker["bind"] = vllm_parse_id_list(text)
        workers.append(worker)
    report["workers"] = workers
    return report


def api_server() -> dict[str, Any]:
    """The API server: imports torch (loads libgomp), then starts EngineCore."""
    report = process_report(children=False)
    report["engine_core"] = run_child(["engine-core"])
    return report


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "process"
    if mode == "process":
        report = process_report(children=True)
    elif mode == "leaf":
        report = process_report(children=False)
    elif mode == "engine-core":
        report = engine_core()
    elif mode == "vllm-tree":
        report = api_server()
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
