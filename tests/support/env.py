"""What the tests stand on: the repository, the real s390x dumps, the default resource names, and the rule for a
tool or library a test needs: skip here, fail under CI=true (where .ci/run installs it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
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
RUNTIME_HANDLERS = ("runc", "crun")


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
