"""vLLM itself as the judge on the real cluster: the lane's server pod (the shipped example with the lane's image and
tiny model), started and stopped, asked for a completion, and its threads' CPUs and memory nodes read from /proc."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import apply, kjson, wait_kubectl
from topology_devkit.vllm.server import NAMESPACE, PORT

PODS = NAMESPACE
START_TIMEOUT = 480  # image layers first touched, `import vllm` 7-17 s, engine start: 55-75 s seen unloaded
SECCOMP_VALUES = ("--set", "seccompProfile.install=true")
BINDING = re.compile(r"local_rank=(\d+), core ids=\[([\d, ]*)\]")
NUMA = re.compile(r"NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes \(([\d, ]+)\)")


def delete(env: E2EEnv, *what: str) -> None:
    env.kubectl("-n", PODS, "delete", *what, "--wait=true", "--ignore-not-found", timeout=180)


def logs(env: E2EEnv, name: str) -> str:
    try:
        return env.kubectl("-n", PODS, "logs", name, timeout=60).stdout
    except subprocess.CalledProcessError as exc:
        return exc.stderr


def serve(env: E2EEnv, doc: dict[str, Any], timeout: float = START_TIMEOUT) -> str:
    """Create the pod and wait until it is Ready (vLLM's /health answers); fails early when it stops instead."""
    name = doc["metadata"]["name"]
    apply(env, doc)

    def ready() -> bool:
        pod = kjson(env, "-n", PODS, "get", "pod", name)
        status = pod["status"]
        if status.get("phase") in ("Failed", "Succeeded"):
            pytest.fail(f"vLLM pod {name} stopped ({status.get('phase')}: {status.get('reason')} "
                        f"{status.get('message')}; containers {status.get('containerStatuses')}) before it was "
                        "ready:\n" + "\n".join(logs(env, name).splitlines()[-30:]))
        return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))

    started = time.monotonic()
    wait_kubectl(f"vLLM pod {name} to be Ready", ready, timeout=timeout, every=2)
    print(f"{name}: Ready {time.monotonic() - started:.0f} s after its creation")
    return name


def stopped(env: E2EEnv, doc: dict[str, Any], timeout: float = START_TIMEOUT) -> tuple[str, str]:
    """Create the pod and wait until vLLM stops; (phase, its log)."""
    name = doc["metadata"]["name"]
    apply(env, doc)
    phase = wait_kubectl(f"vLLM pod {name} to stop", lambda: (lambda p: p if p in ("Failed", "Succeeded") else None)(
        kjson(env, "-n", PODS, "get", "pod", name)["status"].get("phase")), timeout=timeout, every=2)
    return str(phase), logs(env, name)


def in_pod(env: E2EEnv, name: str, script: str, timeout: float = 60) -> str:
    return env.kubectl("-n", PODS, "exec", name, "--", "sh", "-c", script, timeout=timeout).stdout


def complete(env: E2EEnv, name: str, prompt: str = "The agent gives each rank", tokens: int = 8) -> dict[str, Any]:
    """POST /v1/completions to the server from inside its pod (loopback); vLLM's JSON answer."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": tokens, "temperature": 0})
    script = ("import json, sys, urllib.request; r = urllib.request.Request("
              f"'http://127.0.0.1:{PORT}/v1/completions', data=sys.argv[1].encode(), "
              "headers={'Content-Type': 'application/json'}); "
              "print(urllib.request.urlopen(r, timeout=60).read().decode())")
    out = env.kubectl("-n", PODS, "exec", name, "--", "python", "-c", script, body, timeout=120).stdout
    return dict(json.loads(out))


def container_env(env: E2EEnv, name: str) -> dict[str, str]:
    out = in_pod(env, name, "cat /proc/1/environ | tr '\\0' '\\n'")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@dataclass(frozen=True)
class Thread:
    pid: int
    title: str  # the process's command line as setproctitle left it (VLLM::Worker_TP0, ...)
    tid: int
    comm: str
    cpus: frozenset[int]
    mems: str


THREADS = r"""
for t in /proc/[0-9]*/task/[0-9]*; do
  p=${t#/proc/}; p=${p%%/*}
  title=$(tr '\0\n\t' '   ' < /proc/$p/cmdline 2>/dev/null | cut -c1-60) || continue
  comm=$(cat $t/comm 2>/dev/null) || continue
  cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' $t/status 2>/dev/null)
  mems=$(sed -n 's/^Mems_allowed_list:[[:space:]]*//p' $t/status 2>/dev/null)
  [ -n "$cpus" ] && printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$title" "${t##*/}" "$comm" "$cpus" "$mems"
done
"""


def threads(env: E2EEnv, name: str) -> list[Thread]:
    """Every thread of every process in the container, as the kernel reports it (the exec's own shell included)."""
    found: list[Thread] = []
    for line in in_pod(env, name, THREADS).splitlines():
        pid, title, tid, comm, cpus, mems = line.split("\t")
        found.append(Thread(int(pid), title.strip(), int(tid), comm, frozenset(parse_cpulist(cpus)), mems))
    return found


def logged_binding(log: str) -> dict[int, frozenset[int]]:
    """vLLM's own ``OpenMP thread binding info``: rank -> core ids."""
    assert "OpenMP thread binding info" in log, "vLLM logged no OpenMP binding:\n" + log[-3000:]
    return {int(rank): frozenset(int(c) for c in cores.replace(" ", "").split(",") if c)
            for rank, cores in BINDING.findall(log)}


def rank_lists(bind: str) -> list[frozenset[int]]:
    return [frozenset(parse_cpulist(part)) for part in bind.split("|")]


def judge(env: E2EEnv, name: str, books: int) -> dict[str, str]:
    """Everything vLLM and the kernel say about a served pod's binding; the container's environment."""
    got = container_env(env, name)
    cpus = frozenset(parse_cpulist(got["TOPOLOGY_CPUS"]))
    ranks = rank_lists(got["VLLM_CPU_OMP_THREADS_BIND"])
    assert len(ranks) == books == int(got["TOPOLOGY_RANKS"]), got
    answer = complete(env, name)
    assert answer["usage"]["completion_tokens"] == 8, answer
    assert answer["choices"][0]["text"], answer
    log = logs(env, name)
    assert logged_binding(log) == dict(enumerate(ranks)), (
        f"vLLM bound {logged_binding(log)}, the agent gave {got['VLLM_CPU_OMP_THREADS_BIND']}")
    for rank in ranks:
        assert rank <= cpus
    numa = NUMA.findall(log)
    assert numa and {n.replace(" ", "") for n in numa} == {got["CPU_VISIBLE_MEMORY_NODES"]}, (numa, got)
    seen = threads(env, name)
    outside = [t for t in seen if not t.cpus <= cpus]
    assert not outside, f"threads allowed CPUs outside the books {got['TOPOLOGY_CPUS']}: {outside[:5]}"
    assert {t.mems for t in seen} == {got["CPU_VISIBLE_MEMORY_NODES"]}, {t.mems for t in seen}
    workers: dict[int, list[Thread]] = {}
    for t in seen:
        if t.title.startswith("VLLM::Worker"):
            workers.setdefault(t.pid, []).append(t)
    assert len(workers) == books, f"{books} worker processes expected, found {sorted(workers)}: {seen[:8]}"
    held: list[frozenset[int]] = []
    for pid, its in workers.items():
        allowed = frozenset().union(*(t.cpus for t in its))
        match = re.search(r"TP(\d+)", its[0].title)
        index = int(match.group(1)) if match else 0
        assert allowed <= ranks[index], (
            f"worker {pid} ({its[0].title}) has threads on {sorted(allowed)}, rank {index} was given "
            f"{sorted(ranks[index])}")
        held.append(allowed)
    for i, one in enumerate(held):
        for other in held[i + 1:]:
            assert not one & other, f"two ranks share CPUs {sorted(one & other)}"
    return got


def hold_book(env: E2EEnv, node: str, name: str, prefix: str = "topology") -> frozenset[int]:
    """A busybox pod holding one book (sleep); its CPUs once it runs."""
    apply(env, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": PODS},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                         "terminationGracePeriodSeconds": 1, "containers": [{
                             "name": "main", "image": env.workload_image, "imagePullPolicy": "Never",
                             "command": ["sh", "-c", "sleep 3600"],
                             "resources": {"requests": {"cpu": "1", "memory": "16Mi", f"{prefix}/book": 1},
                                           "limits": {"memory": "32Mi", f"{prefix}/book": 1}}}]}})
    wait_kubectl(f"{name} to run",
                 lambda: kjson(env, "-n", PODS, "get", "pod", name)["status"].get("phase") == "Running", timeout=120)
    out = env.kubectl("-n", PODS, "exec", name, "--", "sh", "-c", "env", timeout=60).stdout
    return frozenset(parse_cpulist(dict(line.split("=", 1) for line in out.splitlines() if "=" in line)[
        "TOPOLOGY_CPUS"]))


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"
