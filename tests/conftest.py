"""The fixtures every folder of the suite may use: a private real containerd per module, its runtime handlers, and
the short /tmp folders of the running-agent harness removed with the session. Helpers live in tests/support/."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.env import RUNTIME_HANDLERS, missing

if TYPE_CHECKING:
    from topology_devkit.containerd import Containerd


@pytest.fixture(scope="session", autouse=True)
def _remove_short_tmpdirs() -> Iterator[None]:
    """The directories tests made under /tmp with short_tmpdir (agent logs, sockets) go with the session."""
    import shutil

    yield
    # Only if a test imported the harness: importing it here would pull in grpc, which the s390x smoke's root lacks
    # (every test there would be reported "skipped: needs grpc" at this fixture's setup).
    harness = sys.modules.get("tests.support.harness")
    for path in getattr(harness, "MADE", ()):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def ctd(request: pytest.FixtureRequest) -> Iterator[Containerd]:
    """A private real containerd for the tests of one module (missing: skipped here, failed in CI)."""
    from topology_devkit.containerd import Containerd, ContainerdUnavailable

    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    try:
        harness = Containerd(f"test-{name[:12]}").__enter__()
    except ContainerdUnavailable as exc:
        missing("a real containerd", exc.reason)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(params=RUNTIME_HANDLERS)
def handler(request: pytest.FixtureRequest, ctd: Containerd) -> str:
    """Each runtime handler containerd has (runc, crun); one that cannot run is missing."""
    name: str = request.param
    problem = ctd.handler_problems()[name]
    if problem is not None:
        missing(f"the {name} runtime handler", problem)
    return name
