"""``topology-agent serve`` as a real process next to the kubelet emulator, for fault tests and benches:
its log (JSON lines, in a file unless a test wants a pipe it never reads), its HTTP port, its
metrics, a gRPC client of its plugin sockets, and its memory."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.plugin.server import socket_name
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import poll_until, wait_until

STOP_TIMEOUT = 20.0  # seconds stop() waits after SIGTERM (the agent's own shutdown bound is well below)
LOG_TAIL = 60  # log lines shown with the stacks of an agent that did not stop


def free_port() -> int:
    """A TCP port nothing listens on right now (``--metrics-port 0`` disables the endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AgentProcess:
    """``serve`` as a process. The defaults suit tests (a snapshot, no rescans, metrics on 127.0.0.1);
    benches that run the agent as a DaemonSet does pass ``topology=None`` (give ``--host-root``),
    ``rescan_interval=None`` and ``metrics_address=None`` (the agent's own defaults), ``entry`` (the
    command that runs the CLI, e.g. an installed ``topology-agent`` script), ``env`` and ``cwd``."""

    def __init__(self, kubelet: KubeletEmulator, workdir: Path, *args: str, topology: str | None = "embedded:z16-lpar",
                 pod_resources: Path | None = None, stderr_pipe: bool = False,
                 preexec: Callable[[], None] | None = None, python: list[str] | None = None,
                 entry: Sequence[str] | None = None, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 rescan_interval: str | None = "0", metrics_address: str | None = "127.0.0.1") -> None:
        self.kubelet = kubelet
        self.log_path = workdir / f"agent-{time.monotonic_ns()}.log"
        self._log_file: IO[str] | None = None if stderr_pipe else open(self.log_path, "w")  # noqa: SIM115
        self.metrics_port = free_port()
        command = [*(entry or [*(python or [sys.executable]), "-m", "agent"]), "serve",
                   *(["--topology-file", topology] if topology is not None else []),
                   "--kubelet-dir", str(kubelet.device_plugin_dir),
                   "--pod-resources-socket", str(pod_resources or kubelet.pod_resources_socket),
                   "--log-format", "json", "--metrics-port", str(self.metrics_port),
                   *(["--metrics-address", metrics_address] if metrics_address is not None else []),
                   *(["--rescan-interval", rescan_interval] if rescan_interval is not None else []),
                   # serve's default is auto, which would adopt whatever runtime socket this machine has (a live
                   # real-cluster lane's): a test or bench agent enforces only when it says so (args come last).
                   "--cpuset-enforcement", "none", *args]
        self.command = command
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE if stderr_pipe else self._log_file, text=True,
                                     env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=preexec, cwd=cwd)
        self._port: int | None = None
        self.hang_report: str | None = None  # set by stop() when the process outlived SIGTERM

    # --- its log --------------------------------------------------------------------------
    def log(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    def logged(self, words: str) -> bool:
        return any(words in str(line.get("msg", "")) for line in self.log())

    @property
    def port(self) -> int:
        if self._port is None:
            def found() -> bool:
                for line in self.log():
                    msg = str(line.get("msg", ""))
                    if "on port" in msg and msg.startswith("serving /metrics"):
                        self._port = int(msg.rsplit(" ", 1)[1])
                        return True
                return False
            wait_until("the agent's HTTP port in its log", found, 30)
        assert self._port is not None
        return self._port

    # --- HTTP -----------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = self.get("/metrics")
        assert status == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), float("nan"))

    # --- gRPC -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def plugin(self, resource: str) -> Iterator[api_pb2_grpc.DevicePluginStub]:
        path = self.kubelet.device_plugin_dir / socket_name(resource)
        with grpc.insecure_channel(f"unix://{path}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)

    def allocate(self, resource: str, *requests: list[str], timeout: float = 5.0) -> api_pb2.AllocateResponse:
        with self.plugin(resource) as stub:
            request = api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in requests])
            return stub.Allocate(request, timeout=timeout)

    # --- the process ----------------------------------------------------------------------
    def rss_kib(self) -> int:
        return self.status_kib("VmRSS")

    def status_kib(self, key: str) -> int:
        return status_kib(self.proc.pid, key)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and the exit code. A process still there after ``timeout`` seconds is asked for its threads'
        stacks (SIGUSR1) and killed; what it said is printed to stderr (pytest shows it) and kept in ``hang_report``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.hang_report = self._stacks_and_log_tail(timeout)
                print(self.hang_report, file=sys.stderr, flush=True)
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close()
        return self.proc.returncode

    def _stacks_and_log_tail(self, waited: float) -> str:
        """Every thread's stack (``serve`` dumps them on SIGUSR1) and the log lines before it."""
        head = f"agent pid {self.proc.pid} still running {waited:g} s after SIGTERM ({' '.join(self.command)})"
        if self._log_file is None:  # a pipe the caller reads
            self.proc.send_signal(signal.SIGUSR1)
            return f"{head}; its stacks (SIGUSR1) went to its stderr pipe"
        before = self.log_path.stat().st_size
        self.proc.send_signal(signal.SIGUSR1)
        sizes: list[int] = []

        def dumped() -> bool:  # the dump is written at once, by a C signal handler: done when it stops growing
            sizes.append(self.log_path.stat().st_size)
            return len(sizes) > 1 and sizes[-1] == sizes[-2] and sizes[-1] > before

        poll_until(dumped, 5.0, every=0.2)
        data = self.log_path.read_bytes()
        stacks = data[before:].decode(errors="replace").strip() or "(no stack dump within 5 s)"
        tail = data[:before].decode(errors="replace").splitlines()[-LOG_TAIL:]
        return "\n".join([f"{head}; its threads:", stacks, f"--- the last {len(tail)} lines of its log "
                          f"({self.log_path}):", *tail, "---"])

    def _close(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status``: VmRSS, VmHWM, RssAnon, ..."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of every thread of ``pid`` so far, ended ones included (10 ms ticks)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # from field 3 on; the command may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
