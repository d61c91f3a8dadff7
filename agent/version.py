"""The agent's version and the commit it was built from.

The version has one home, ``agent.__version__`` (PEP 440: ``X.Y.Z``, ``X.Y.ZrcN`` or ``X.Y.Z.devN``); the package
metadata reads it from there, and :func:`semver` gives the chart's ``version`` and ``appVersion`` and the image tag
(SemVer 2: ``X.Y.Z``, ``X.Y.Z-rc.N``, ``X.Y.Z-dev.N``; both orders agree: dev < rc < final).

The commit: from git when the package runs from a checkout, else from ``agent/data/build.json``, which the image's
build writes before it builds the wheel (``{"commit": "<40 hex>"}``); a wheel built without that file says unknown.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from agent import __version__

PEP440 = re.compile(r"(?P<release>\d+\.\d+\.\d+)(?:rc(?P<rc>\d+)|\.dev(?P<dev>\d+))?")
BUILD_INFO = Path(__file__).parent / "data" / "build.json"
COMMIT = re.compile(r"[0-9a-f]{40}")


def semver(version: str) -> str:
    """The SemVer 2 form of a PEP 440 ``version`` (Helm's chart versions, image tags); ValueError for another form."""
    match = PEP440.fullmatch(version)
    if match is None:
        raise ValueError(f"version {version!r:.40} is not X.Y.Z, X.Y.ZrcN or X.Y.Z.devN")
    if match["rc"] is not None:
        return f"{match['release']}-rc.{int(match['rc'])}"
    if match["dev"] is not None:
        return f"{match['release']}-dev.{int(match['dev'])}"
    return match["release"]


def commit_of(package_dir: Path, build_info: Path) -> str:
    """The commit as :func:`commit` says it, for a package at ``package_dir`` with ``build_info`` beside it."""
    checkout = package_dir.parent
    if (checkout / ".git").exists():
        try:
            git = ["git", "-C", str(checkout), "-c", "core.fsmonitor=false"]  # no hook of the checkout's runs
            head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                  check=True).stdout.strip()
            dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            head, dirty = "", ""
        if COMMIT.fullmatch(head):
            return f"{head} with uncommitted changes" if dirty else head
    try:
        baked = json.loads(build_info.read_text()).get("commit", "")
    except (OSError, ValueError, AttributeError):
        baked = ""
    return baked if isinstance(baked, str) and COMMIT.fullmatch(baked) else "unknown"


@lru_cache(maxsize=1)
def commit() -> str:
    """The commit this agent was built from: 40 hex digits (a checkout with changes says so after it), or unknown."""
    return commit_of(Path(__file__).parent, BUILD_INFO)


def version_line() -> str:
    """What ``topology-agent --version`` prints."""
    return f"topology-agent {__version__} (commit {commit()})"
