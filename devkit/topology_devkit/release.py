"""make release VERSION=X.Y.Z [COMMIT=<commit>]: check a release and record it in releases.json.

Refuses, in one line and exit 2, when a version at COMMIT (default HEAD) disagrees with VERSION (agent/__init__.py,
pyproject.toml, Chart.yaml's version and appVersion in SemVer form), when CHANGELOG.md has no section for it, when
the working tree has changes, when COMMIT is not on the current branch, or when VERSION is not newer than every
recorded release. Otherwise it appends {version, commit, date} to releases.json, commits that file alone and tags
the commit vX.Y.Z (the record is what travels with the branch; a tag may not). docs/admin/releases.md has the steps.

    python -m topology_devkit.release build-info: agent/data/build.json (this checkout's commit) for a wheel
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from agent.version import PEP440, semver  # noqa: E402  (the package's own rule, from this checkout)

CHART = "deploy/helm/s390x-topology-agent/Chart.yaml"
PACKAGE = "agent/__init__.py"
RECORD = "releases.json"
CHANGELOG = "CHANGELOG.md"
PACKAGE_VERSION = re.compile(r'^__version__ = "(?P<v>[^"]*)"$', re.MULTILINE)

Reader = Callable[[str], str | None]  # a repository path -> its text at the commit, None when absent


class Refused(Exception):
    """What stops a release: one line."""


def order(version: str) -> tuple[int, int, int, int, int]:
    """Sortable: X.Y.Z.devN < X.Y.ZrcN < X.Y.Z."""
    m = PEP440.fullmatch(version)
    if m is None:
        raise ValueError(version)
    x, y, z = (int(p) for p in m["release"].split("."))
    if m["dev"] is not None:
        return x, y, z, 0, int(m["dev"])
    if m["rc"] is not None:
        return x, y, z, 1, int(m["rc"])
    return x, y, z, 2, 0


def versions(read: Reader) -> dict[str, str]:
    """Every place a version is written, as found: the package, pyproject.toml, the chart's version and appVersion."""
    found: dict[str, str] = {}
    package = read(PACKAGE) or ""
    m = PACKAGE_VERSION.search(package)
    found[PACKAGE] = m["v"] if m else "(none)"
    project = tomllib.loads(read("pyproject.toml") or "")
    if "version" in project.get("project", {}):
        found["pyproject.toml"] = str(project["project"]["version"])
    else:
        attr = project.get("tool", {}).get("setuptools", {}).get("dynamic", {}).get("version", {}).get("attr")
        found["pyproject.toml"] = found[PACKAGE] if attr == "agent.__version__" else f"(dynamic from {attr})"
    chart = yaml.safe_load(read(CHART) or "") or {}
    found[f"{CHART} version"] = str(chart.get("version"))
    found[f"{CHART} appVersion"] = str(chart.get("appVersion"))
    return found


def disagreements(version: str, found: dict[str, str]) -> list[str]:
    """Where ``found`` does not say ``version`` (the chart in its SemVer form)."""
    want = {place: (semver(version) if place.startswith(CHART) else version) for place in found}
    return [f"{place} says {found[place]}, not {want[place]}" for place in found if found[place] != want[place]]


def changelog_has(version: str, text: str) -> bool:
    """Keep a Changelog: a ``## [X.Y.Z] - YYYY-MM-DD`` heading."""
    return re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d\d-\d\d$", text, re.MULTILINE) is not None


def problems(version: str, *, read: Reader, changelog: str, dirty: str, on_branch: bool,
             recorded: Sequence[dict[str, str]]) -> list[str]:
    """Why ``version`` cannot be released from the commit ``read`` shows; empty when it can."""
    if PEP440.fullmatch(version) is None or ".dev" in version:
        return [f"VERSION {version!r:.40} is not X.Y.Z or X.Y.ZrcN"]
    out = disagreements(version, versions(read))
    if not changelog_has(version, changelog):
        out.append(f"{CHANGELOG} has no '## [{version}] - YYYY-MM-DD' section")
    if dirty:
        out.append(f"the working tree has changes ({dirty.splitlines()[0].strip()}, ...): commit or stash them")
    if not on_branch:
        out.append("the commit is not on the current branch")
    newest = max((r["version"] for r in recorded), key=order, default=None)
    if newest is not None and order(version) <= order(newest):
        out.append(f"{RECORD} already has {newest}: a release must be newer")
    return out


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60, check=check)


def read_at(repo: Path, commit: str) -> Reader:
    def read(path: str) -> str | None:
        shown = git(repo, "show", f"{commit}:{path}", check=False)
        return shown.stdout if shown.returncode == 0 else None
    return read


def load_record(repo: Path) -> list[dict[str, str]]:
    path = repo / RECORD
    if not path.exists():
        return []
    return list(json.loads(path.read_text())["releases"])


def record(repo: Path, version: str, commit: str, today: str) -> str:
    """Check, then record ``version`` at ``commit``: the line to print. Raises :class:`Refused`."""
    resolved = git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False).stdout.strip()
    if not resolved:
        raise Refused(f"no commit {commit!r:.60} in {repo}")
    changelog_path = repo / CHANGELOG
    recorded = load_record(repo)
    found = problems(version, read=read_at(repo, resolved),
                     changelog=changelog_path.read_text() if changelog_path.exists() else "",
                     dirty=git(repo, "status", "--porcelain").stdout,
                     on_branch=git(repo, "merge-base", "--is-ancestor", resolved, "HEAD", check=False).returncode == 0,
                     recorded=recorded)
    if found:
        raise Refused("; ".join(found))
    entry = {"version": version, "commit": resolved, "date": today}
    text = json.dumps({"releases": [*recorded, entry]}, indent=2) + "\n"
    (repo / RECORD).write_text(text)
    git(repo, "add", RECORD)
    git(repo, "commit", "--quiet", "-m", f"Release {version}: recorded (commit {resolved[:12]}, {today})", "--", RECORD)
    tagged = git(repo, "tag", "-a", f"v{version}", resolved, "-m", f"s390x-topology-agent {version}", check=False)
    tag = f"tagged v{version}" if tagged.returncode == 0 else f"not tagged ({tagged.stderr.strip()[:80]})"
    return f"recorded {version} at {resolved[:12]} in {RECORD} ({tag}); next: move {PACKAGE} to the next .dev0"


def build_info(repo: Path) -> str:
    head = git(repo, "rev-parse", "HEAD").stdout.strip()
    if git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise Refused("the working tree has changes: a wheel's commit must be one that holds its code")
    path = repo / "agent" / "data" / "build.json"
    path.write_text(json.dumps({"commit": head}) + "\n")
    return f"wrote {path.relative_to(repo)}: commit {head}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make release", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--version", default="")
    rec.add_argument("--commit", default="HEAD")
    rec.add_argument("--date", default=datetime.now(UTC).strftime("%Y-%m-%d"))
    rec.add_argument("--repo", type=Path, default=REPO)
    info = sub.add_parser("build-info")
    info.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args(argv)
    try:
        if args.command == "build-info":
            print(build_info(args.repo))
            return 0
        if not args.version:
            raise Refused("VERSION is required: make release VERSION=X.Y.Z [COMMIT=<commit>]")
        print(record(args.repo, args.version, args.commit, args.date))
        return 0
    except (Refused, subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        print(f"make release: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
