"""Where a vLLM server's request time goes (bench/cluster/vllm_beside_hog.py), pure: vLLM's own request timings and
every server thread's CPU and run-queue time, each read before and after the timed stream and subtracted.

* vLLM's timings: its Prometheus histograms' ``_sum`` and ``_count`` (vLLM v1's request metrics: end to end from
  the API server's receipt, queued, prefill, decode, inference = prefill + decode, time to first token), as a mean
  per request over the stream. The client's latency minus vLLM's end to end is the path outside vLLM (the client,
  the network); end to end minus queued and inference is the API server process's own part (HTTP, tokenizing,
  detokenizing, its hand-offs with the engine core).
* The threads: ``/proc/<pid>/task/<tid>/schedstat`` inside the container (time on a CPU, time runnable but waiting
  for one), as :data:`THREADS_SCRIPT` prints it; each process named by its main thread's name (vLLM names its
  engine core ``VLLM::EngineCore``).
* The book's CPUs (:func:`book_cpus`): their busy and steal time from the host's /proc/stat, the server's share of it,
  and the host threads allowed on them that ran meanwhile: what else the book's CPUs served.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

PHASES = ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
          "request_inference_time", "time_to_first_token")
PREFIX = "vllm:"
# Run inside the server's container (sh): one line per thread, "T pid tid run_ns wait_ns comm".
THREADS_SCRIPT = ("for t in /proc/[0-9]*/task/[0-9]*; do p=${t#/proc/}; p=${p%%/*}; "
                  "read r w s < $t/schedstat 2>/dev/null || continue; read c < $t/comm 2>/dev/null || c=?; "
                  'echo "T $p ${t##*/} $r $w $c"; done')
SHELL_NAMES = frozenset({"sh", "cat", "dash", "bash"})  # the script's own processes


def histogram_totals(text: str) -> dict[str, float]:
    """``<phase>_sum`` and ``<phase>_count`` of vLLM's timing histograms (all label sets added up) from a
    Prometheus text page."""
    wanted = {f"{PREFIX}{p}_seconds_{end}": f"{p}_{end}" for p in PHASES for end in ("sum", "count")}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = wanted.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def phase_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean seconds per request of each phase over the requests between the two pages (phases with none left out)."""
    out: dict[str, float] = {}
    for phase in PHASES:
        count = after.get(f"{phase}_count", 0.0) - before.get(f"{phase}_count", 0.0)
        if count > 0:
            out[phase] = (after.get(f"{phase}_sum", 0.0) - before.get(f"{phase}_sum", 0.0)) / count
    return out


@dataclass(frozen=True)
class Thread:
    pid: int
    tid: int
    run_ns: int
    wait_ns: int
    comm: str


def parse_threads(text: str) -> dict[tuple[int, int], Thread]:
    """:data:`THREADS_SCRIPT`'s output by (pid, tid); other lines are ignored."""
    out: dict[tuple[int, int], Thread] = {}
    for line in text.splitlines():
        parts = line.split(" ", 5)
        if len(parts) < 5 or parts[0] != "T":
            continue
        try:
            pid, tid, run_ns, wait_ns = (int(x) for x in parts[1:5])
        except ValueError:
            continue
        out[(pid, tid)] = Thread(pid, tid, run_ns, wait_ns, parts[5] if len(parts) > 5 else "?")
    return out


@dataclass(frozen=True)
class ProcessTime:
    """One process over the stream: CPU time, run-queue wait, and its thread that waited longest."""

    name: str
    pid: int
    run_s: float
    wait_s: float
    top_thread: str
    top_wait_s: float


def process_times(before: dict[tuple[int, int], Thread], after: dict[tuple[int, int], Thread]) -> list[ProcessTime]:
    """Per process of ``after``: what its threads ran and waited since ``before`` (a thread new since counts whole),
    the longest waiters first; the script's own shells left out."""
    names = {t.pid: t.comm for t in after.values() if t.pid == t.tid}
    grouped: dict[int, list[tuple[str, int, int]]] = {}
    for key, t in after.items():
        old = before.get(key)
        run = t.run_ns - (old.run_ns if old else 0)
        wait = t.wait_ns - (old.wait_ns if old else 0)
        grouped.setdefault(t.pid, []).append((t.comm, max(run, 0), max(wait, 0)))
    out = []
    for pid, threads in grouped.items():
        name = names.get(pid, "?")
        if name in SHELL_NAMES:
            continue
        top = max(threads, key=lambda item: item[2])
        out.append(ProcessTime(name, pid, sum(t[1] for t in threads) / 1e9, sum(t[2] for t in threads) / 1e9,
                               top[0], top[2] / 1e9))
    return sorted(out, key=lambda p: (-p.wait_s, p.pid))


def per_request(means: dict[str, float], client_mean: float, processes: list[ProcessTime],
                requests: int) -> dict[str, float]:
    """The stream's figures in ms per request: the client's mean, vLLM's phases, the part outside vLLM and the API
    server's own part, and each process's CPU and run-queue time (``<name> run``, ``<name> wait``)."""
    out = {"client": client_mean * 1e3}
    if "e2e_request_latency" in means:
        e2e = means["e2e_request_latency"]
        inside = means.get("request_queue_time", 0.0) + means.get("request_inference_time", 0.0)
        out.update({"vLLM e2e": e2e * 1e3, "outside vLLM": (client_mean - e2e) * 1e3,
                    "API server's part": (e2e - inside) * 1e3})
        for phase, label in (("request_queue_time", "queued"), ("request_prefill_time", "prefill"),
                             ("request_decode_time", "decode")):
            if phase in means:
                out[label] = means[phase] * 1e3
    if requests > 0:
        for p in processes:
            out.setdefault(f"{p.name} run", 0.0)
            out.setdefault(f"{p.name} wait", 0.0)
            out[f"{p.name} run"] += p.run_s / requests * 1e3
            out[f"{p.name} wait"] += p.wait_s / requests * 1e3
    return out


def line(figures: dict[str, float]) -> str:
    """``per_request``'s figures as one line."""
    return "ms/request: " + ", ".join(f"{name} {value:.1f}" for name, value in figures.items())


# What ran on the book's CPUs beside the server. The kernel's per-CPU time is /proc/stat's ``cpuN`` lines (USER_HZ
# ticks: user nice system idle iowait irq softirq steal ...; proc(5)); every host thread's CPU time is its
# ``/proc/<pid>/task/<tid>/schedstat`` (ns), its allowed CPUs its status' ``Cpus_allowed_list``.
@dataclass(frozen=True)
class CpuTicks:
    busy: int  # every column but idle, iowait and steal
    steal: int  # time the hypervisor ran something else on this virtual CPU


def parse_proc_stat(text: str) -> dict[int, CpuTicks]:
    """Per CPU number, its busy and steal ticks from a /proc/stat text."""
    out: dict[int, CpuTicks] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        try:
            ticks = [int(x) for x in rest.split()]
        except ValueError:
            continue
        ticks += [0] * (8 - len(ticks))
        out[int(name[3:])] = CpuTicks(sum(ticks) - ticks[3] - ticks[4] - ticks[7], ticks[7])
    return out


@dataclass(frozen=True)
class HostThread:
    pid: int
    tid: int
    comm: str
    run_ns: int
    allowed: frozenset[int]
    cgroup: str  # its cpuset cgroup path


@dataclass(frozen=True)
class BookCpus:
    """The book's CPUs over the stream, in seconds: busy, of which the server's threads, steal, and the other host
    threads allowed on them that ran meanwhile (the most first: name, pid, CPU seconds anywhere, cpuset cgroup)."""

    busy_s: float
    server_s: float
    steal_s: float
    others: tuple[tuple[str, int, float, str], ...]


def book_cpus(stat_before: dict[int, CpuTicks], stat_after: dict[int, CpuTicks], hz: int, cpus: frozenset[int],
              before: dict[tuple[int, int], HostThread], after: dict[tuple[int, int], HostThread],
              server_marks: Sequence[str], top: int = 5) -> BookCpus:
    """What the book's CPUs did between two samples. A thread is the server's when its cgroup path holds one of
    ``server_marks`` (the pod's UID as the runtime spells it). A thread of another cgroup that may run on a book CPU
    and gained CPU time is a candidate intruder: its time may have been spent on other CPUs too, so the list names
    suspects, and busy minus the server's is what the book's CPUs gave to anything else."""
    def delta(get: Callable[[CpuTicks], int]) -> float:
        return sum(get(stat_after[c]) - get(stat_before[c]) for c in cpus
                   if c in stat_after and c in stat_before) / hz

    server = 0
    others: list[tuple[str, int, float, str]] = []
    per_pid: dict[int, tuple[str, int, str]] = {}
    for key, t in after.items():
        old = before.get(key)
        gained = t.run_ns - (old.run_ns if old else 0)
        if gained <= 0:
            continue
        if any(mark in t.cgroup for mark in server_marks):
            server += gained
        elif t.allowed & cpus:
            name, ns, cgroup = per_pid.get(t.pid, (t.comm if t.pid == t.tid else "", 0, t.cgroup))
            per_pid[t.pid] = (name or (t.comm if t.pid == t.tid else ""), ns + gained, cgroup)
    for pid, (name, ns, cgroup) in per_pid.items():
        others.append((name or "?", pid, ns / 1e9, cgroup))
    others.sort(key=lambda o: (-o[2], o[1]))
    return BookCpus(delta(lambda c: c.busy), server / 1e9, delta(lambda c: c.steal), tuple(others[:top]))


def book_line(found: BookCpus, requests: int) -> str:
    """:func:`book_cpus` as one line, in ms per request."""
    per = 1e3 / max(requests, 1)
    suspects = ", ".join(f"{name}({pid}) {s * per:.1f} [{cgroup}]" for name, pid, s, cgroup in found.others)
    return (f"book CPUs ms/request: busy {found.busy_s * per:.1f}, server {found.server_s * per:.1f}, "
            f"anything else {max(found.busy_s - found.server_s, 0.0) * per:.1f}, steal {found.steal_s * per:.1f}; "
            f"other threads allowed there that ran: {suspects or 'none'}")
