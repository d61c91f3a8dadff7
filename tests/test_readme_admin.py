"""What the README tells an admin matches what the agent and the chart do (issue 24)."""

from __future__ import annotations

import socket

from agent.errors import SocketInUseError
from agent.plugin.server import clear_stale_socket
from tests.conftest import REPO
from tests.plugin_harness import short_tmpdir

README = (REPO / "README.md").read_text(encoding="utf-8")
FLAT = " ".join(README.split())


def test_the_readme_says_one_thing_about_a_second_instance() -> None:
    """exit 2 with one line at start (tests/test_serve_process.py runs it); waited out only once serving."""
    assert "a second instance started beside a running one exits 2 with one line" in FLAT
    assert "At start a live socket of another instance is exit 2 with one line" in FLAT
    assert "a directory or a live socket of another instance at the agent's socket path is waited out" not in FLAT
    path = short_tmpdir() / "x.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(str(path))
        live.listen(1)
        try:
            clear_stale_socket(path)
        except SocketInUseError as exc:
            message = str(exc)
        else:
            raise AssertionError("a live socket was taken over")
    finally:
        live.close()
    said = message.split(" ", 1)[1]  # the path, then the reason
    assert said == "is served by another running process (another topology-agent instance?); refusing to take it over"
    assert said in FLAT
