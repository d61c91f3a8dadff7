"""A recorded release's image and chart, built from its own commit (releases.json), cached by that commit.

The release's tree is checked out with ``git worktree add --detach`` into
``<image cache>/releases/<commit>`` (:func:`topology_devkit.realcluster.images.default_cache`), and its image is
built from that tree with its own Dockerfile.s390x by the lane's buildah build (:func:`images.build_agent`: the same
stand-in base and storage, the release's own commit and times as build args), named
``localhost/s390x-topology-agent:<version>`` and written to ``<image cache>/s390x-topology-agent-<version>-<commit
12>.oci.tar``. Both stay: a later run finds the archive and builds nothing. The chart is the checkout's
``deploy/helm/s390x-topology-agent``.

CLI (the e2e test tests/e2e/test_upgrade_release.py runs it through ``python -m topology_devkit.realcluster
release-image VERSION``, which also imports the image into the cluster's runtime)::

    python -m topology_devkit.realcluster.release_image VERSION [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from topology_devkit.realcluster import images

REPO = images.REPO
CHART = Path("deploy") / "helm" / "s390x-topology-agent"
REPOSITORY = "localhost/s390x-topology-agent"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    image: str  # repository:tag, as the runtime knows it
    archive: Path  # its OCI archive
    chart: Path  # the release's own chart
    built: bool  # False when the cached archive was used

    @property
    def tag(self) -> str:
        return self.image.rpartition(":")[2]


def recorded_commit(version: str, repo: Path = REPO) -> str:
    """The commit releases.json records for ``version``; ImageError when it records none."""
    releases = json.loads((repo / "releases.json").read_text())["releases"]
    commit = next((r["commit"] for r in releases if r["version"] == version), None)
    if commit is None:
        raise images.ImageError(f"releases.json records no release {version!r}")
    return str(commit)


def checkout(commit: str, cache: Path, repo: Path = REPO) -> Path:
    """The release's tree at ``<cache>/releases/<commit>`` (``git worktree add --detach``, once per commit).

    A tree there that git no longer knows at that commit (made from a clone since removed, as CI's clean clones are,
    or moved) is removed and made again from ``repo``: the cache folder holds nothing else."""
    where = cache / "releases" / commit
    if where.exists():
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=60, check=False)
        if head.returncode == 0 and head.stdout.strip() == commit:
            return where
        shutil.rmtree(where)
    where.parent.mkdir(parents=True, exist_ok=True)
    images._run(["git", "-C", repo, "worktree", "prune"], "git worktree prune")  # a cache emptied by hand
    images._run(["git", "-C", repo, "worktree", "add", "--detach", where, commit], "git worktree add")
    return where


def build(version: str, cache: Path | None = None, timings: dict[str, float] | None = None,
          repo: Path = REPO) -> Release:
    """The release's image (built once per commit, then the cached archive) and its chart."""
    cache = Path(cache) if cache is not None else images.default_cache()
    commit = recorded_commit(version, repo)
    image = f"{REPOSITORY}:{version}"
    archive = cache / f"s390x-topology-agent-{version}-{commit[:12]}.oci.tar"
    with images._locked(cache):
        tree = checkout(commit, cache, repo)
        built = not archive.is_file()
        if built:
            reason = images.unavailable_reason()
            if reason is not None:
                raise images.ImageError(reason)
            with images.timed(f"release {version} image (cold, from {commit[:12]})", timings):
                made = images.build_agent(cache, timings, context=tree, image=image)
                made.replace(archive)
    return Release(version, commit, image, archive, tree / CHART, built)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.realcluster.release_image",
                                     description="Build a recorded release's image from its commit (cached).")
    parser.add_argument("version")
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        release = build(args.version, args.cache)
    except (images.ImageError, OSError, subprocess.SubprocessError) as exc:
        print(f"release-image: {exc}", file=sys.stderr)
        return 1
    print(f"{release.image}\t{release.archive}\t{release.chart}")
    images.say(f"release {release.version}: {'built' if release.built else 'cached'} in "
               f"{time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
