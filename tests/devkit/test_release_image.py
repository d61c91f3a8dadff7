"""A recorded release's image and chart from its own commit (topology_devkit.realcluster.release_image): the tree is a
worktree of the commit releases.json names, made once per commit (again when git no longer knows it); an image
archive already built for that commit is used as it is (a warm run builds nothing). The build itself runs on the real
lane (tests/e2e/test_upgrade_release_real.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from topology_devkit.realcluster import images, release_image


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository with two commits; releases.json (in the second) records the first as 0.1.0."""
    where = tmp_path / "repo"
    where.mkdir()
    git(where, "init", "-q", "-b", "main")
    chart = where / release_image.CHART
    chart.mkdir(parents=True)
    (chart / "Chart.yaml").write_text("version: 0.1.0\n")
    git(where, "add", ".")
    git(where, "commit", "-q", "-m", "0.1.0")
    first = git(where, "rev-parse", "HEAD")
    (chart / "Chart.yaml").write_text("version: 0.2.0-dev.0\n")
    (where / "releases.json").write_text(json.dumps({"releases": [{"version": "0.1.0", "commit": first}]}))
    git(where, "add", ".")
    git(where, "commit", "-q", "-m", "next")
    return where, first, git(where, "rev-parse", "HEAD")


def test_the_release_tree_is_a_worktree_of_its_commit_made_once(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    where, first, _ = repo
    cache = tmp_path / "cache"
    tree = release_image.checkout(first, cache, where)
    assert tree == cache / "releases" / first
    assert git(tree, "rev-parse", "HEAD") == first
    assert (tree / release_image.CHART / "Chart.yaml").read_text() == "version: 0.1.0\n"
    assert release_image.checkout(first, cache, where) == tree  # the second time: the same tree, nothing added
    assert git(where, "worktree", "list").count(str(tree)) == 1


def test_a_tree_git_no_longer_knows_is_made_again(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    where, first, second = repo
    cache = tmp_path / "cache"
    git(where, "worktree", "add", "-q", "--detach", str(cache / "releases" / first), second)  # at another commit
    tree = release_image.checkout(first, cache, where)
    assert git(tree, "rev-parse", "HEAD") == first
    clone = tmp_path / "clone"  # a clean clone, since removed, made the tree: its .git names a folder that is gone
    git(tmp_path, "clone", "-q", str(where), str(clone))
    shutil.rmtree(tree)
    git(where, "worktree", "prune")
    git(clone, "worktree", "add", "-q", "--detach", str(tree), first)
    shutil.rmtree(clone)
    assert release_image.checkout(first, cache, where) == tree
    assert git(tree, "rev-parse", "HEAD") == first
    assert (tree / release_image.CHART / "Chart.yaml").read_text() == "version: 0.1.0\n"


def test_a_cached_archive_is_used_without_a_build(repo: tuple[Path, str, str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    where, first, _ = repo
    cache = tmp_path / "cache"
    archive = cache / f"s390x-topology-agent-0.1.0-{first[:12]}.oci.tar"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"built before")

    def no_build(*args: object, **kwargs: object) -> Path:
        raise AssertionError("built again")

    monkeypatch.setattr(images, "build_agent", no_build)
    made = release_image.build("0.1.0", cache, repo=where)
    assert (made.image, made.archive, made.built, made.tag) == ("localhost/s390x-topology-agent:0.1.0", archive,
                                                                 False, "0.1.0")
    assert made.chart == cache / "releases" / first / release_image.CHART


def test_a_version_not_recorded_is_one_line(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match=re.escape("releases.json records no release '9.9.9'")):
        release_image.build("9.9.9", tmp_path / "cache", repo=repo[0])
