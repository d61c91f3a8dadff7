"""Shared test helpers: where the real s390x dumps live, and skipping cleanly without them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from topology_devkit.containerd import Containerd

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
BOOK, SOCKET = "topology/book", "topology/socket"  # the resources under the default prefix
REAL_FIXTURES = Path(os.environ.get("S390X_FIXTURES", REPO.parent / "shared" / "fixtures" / "s390x-real"))

# Each real dump: name -> (dump dir holding lscpu outputs, host root holding sys/ and proc/)
REAL_DUMPS: dict[str, tuple[str, str]] = {
    "s390-kvm": ("util-linux/s390-kvm", "util-linux/s390-kvm"),
    "s390-lpar": ("util-linux/s390-lpar", "util-linux/s390-lpar"),
    "s390-lpar-drawer": ("util-linux/s390-lpar-drawer", "util-linux/s390-lpar-drawer"),
    "s390-nested-virt": ("util-linux/s390-nested-virt", "util-linux/s390-nested-virt"),
    "s390-zvm": ("util-linux/s390-zvm", "util-linux/s390-zvm"),
    "hwloc-20s390-2g6s4c": ("hwloc/hwloc-20s390-2g6s4c", "hwloc/hwloc-20s390-2g6s4c/20s390-2g2g2s4co"),
    "hwloc-2s390-2c": ("hwloc/hwloc-2s390-2c", "hwloc/hwloc-2s390-2c/2s390-2c"),
}


def real_fixtures_available() -> bool:
    return REAL_FIXTURES.is_dir()


def real_fixtures() -> Path:
    """The folder of real s390x dumps; when absent the test is skipped here and fails under CI=true."""
    if not REAL_FIXTURES.is_dir():
        missing(f"real s390x dumps at {REAL_FIXTURES}", "they live in ../shared/fixtures, or set S390X_FIXTURES")
    return REAL_FIXTURES


def real_dump(name: str) -> tuple[Path, Path]:
    """(dump dir, host root) of a real dump (see :func:`real_fixtures`)."""
    dump_dir, root = REAL_DUMPS[name]
    return real_fixtures() / dump_dir, real_fixtures() / root


def missing(what: str, how: str) -> NoReturn:
    """A tool or library a test needs is absent: skip here, fail under CI=true (CI installs it)."""
    if IN_CI:
        pytest.fail(f"{what} is missing under CI=true: {how}", pytrace=False)
    pytest.skip(f"{what} not available ({how})")


RUNTIME_HANDLERS = ("runc", "crun")


@pytest.fixture(scope="session", autouse=True)
def _remove_short_tmpdirs() -> Iterator[None]:
    """The directories tests made under /tmp with short_tmpdir (agent logs, sockets) go with the session."""
    import shutil

    yield
    # Only if a test imported the harness: importing it here would pull in grpc, which the s390x smoke's root lacks
    # (every test there was reported "skipped: needs grpc" at this fixture's setup).
    harness = sys.modules.get("tests.plugin_harness")
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
