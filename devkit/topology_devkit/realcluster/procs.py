"""Starting and stopping the lane's processes by pid file, and waiting on conditions with deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .layout import Layout


class ClusterError(RuntimeError):
    """A component failed: the message says which and ends with its last log lines."""


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (state Z: PID 1 here reaps slowly) is dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pids_of(program: str, argument: str) -> list[int]:
    """The processes whose program's name ends with ``program`` and that have ``argument`` among their arguments
    (a runtime's shims or monitors, told apart by a path of the lane's in their command line)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(program.encode()) and argument.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def read_pid(layout: Layout, component: str) -> int | None:
    try:
        return int(layout.pidfile(component).read_text().strip())
    except (OSError, ValueError):
        return None


def running(layout: Layout, component: str) -> int | None:
    pid = read_pid(layout, component)
    return pid if pid is not None and alive(pid) else None


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def start(layout: Layout, component: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in a session of its own (it outlives this process), logging to logs/<component>.log."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)
    with layout.log(component).open("ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
    layout.pidfile(component).write_text(f"{proc.pid}\n")
    return proc.pid


def stop(layout: Layout, component: str, timeout: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; removes the pid file. True when something was stopped."""
    pid = read_pid(layout, component)
    layout.pidfile(component).unlink(missing_ok=True)
    if pid is None or not alive(pid):
        return False
    kill_and_wait(pid, timeout)
    return True


def crash(layout: Layout, component: str, timeout: float = 10.0) -> bool:
    """SIGKILL the component (a crash: no cleanup of its own; containerd's shims keep running) and wait until it is
    gone. Its pid file stays for the start that follows. True when something was killed."""
    pid = read_pid(layout, component)
    if pid is None or not alive(pid):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def kill_and_wait(pid: int, timeout: float = 15.0) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.05)


def wait_until(what: str, check: Callable[[], bool], timeout: float, layout: Layout | None = None,
               component: str | None = None, step: float = 0.2) -> None:
    """Poll ``check`` until true; raise ClusterError (with the component's log tail) on timeout or its death."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if layout is not None and component is not None and running(layout, component) is None:
            raise ClusterError(f"{component} exited while waiting for {what}; last lines of "
                               f"{layout.log(component)}:\n{tail(layout.log(component))}")
        if time.monotonic() > deadline:
            where = (f"; last lines of {layout.log(component)}:\n{tail(layout.log(component))}"
                     if layout is not None and component is not None else "")
            raise ClusterError(f"timed out after {timeout:g} s waiting for {what}{where}")
        time.sleep(step)


def run(argv: Sequence[str], timeout: float = 60.0, check: bool = True, input_text: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=input_text)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    return done
