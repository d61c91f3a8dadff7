"""One version everywhere, and `make release` (topology_devkit/release.py): what it refuses, and what it records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from agent import __version__
from agent.version import commit_of, semver
from tests.support.env import REPO
from topology_devkit.release import CHART, changelog_has, disagreements, order, problems, versions

CHANGELOG = (REPO / "CHANGELOG.md").read_text()
RELEASES = json.loads((REPO / "releases.json").read_text())["releases"]


def read_here(path: str) -> str | None:
    file = REPO / path
    return file.read_text() if file.exists() else None


def test_the_package_the_chart_and_pyproject_say_one_version() -> None:
    assert disagreements(__version__, versions(read_here)) == []
    chart = yaml.safe_load((REPO / CHART).read_text())
    assert chart["version"] == chart["appVersion"] == semver(__version__)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]


def test_a_disagreeing_chart_is_named() -> None:
    def read(path: str) -> str | None:
        text = read_here(path) or ""
        return text.replace(f"appVersion: \"{semver(__version__)}\"", 'appVersion: "9.9.9"') if path == CHART else text
    assert disagreements(__version__, versions(read)) == [f"{CHART} appVersion says 9.9.9, not {semver(__version__)}"]


@pytest.mark.parametrize(("pep440", "sem"), [("0.1.0", "0.1.0"), ("0.2.0.dev0", "0.2.0-dev.0"),
                                             ("1.10.3rc2", "1.10.3-rc.2"), ("0.2.0.dev12", "0.2.0-dev.12")])
def test_semver_form(pep440: str, sem: str) -> None:
    assert semver(pep440) == sem


@pytest.mark.parametrize("bad", ["0.2", "0.2.0-dev.0", "v0.1.0", "0.2.0a1", "0.2.0.post1", ""])
def test_other_version_forms_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not X\.Y\.Z"):
        semver(bad)


def test_dev_before_rc_before_the_release_in_both_forms() -> None:
    ordered = ["0.1.0", "0.2.0.dev0", "0.2.0.dev1", "0.2.0rc1", "0.2.0", "0.10.0"]
    assert sorted(reversed(ordered), key=order) == ordered
    # SemVer's precedence (prerelease identifiers compared as ASCII) gives the same order for the SemVer forms
    pre = [semver(v) for v in ordered if "-" in semver(v)]
    assert sorted(reversed(pre)) == pre


def test_the_changelog_has_an_unreleased_section_and_one_per_recorded_release() -> None:
    assert "## [Unreleased]" in CHANGELOG
    for release in RELEASES:
        assert changelog_has(release["version"], CHANGELOG), release["version"]


def test_the_record_lists_releases_in_order_with_full_commits() -> None:
    assert [r["version"] for r in RELEASES] == sorted((r["version"] for r in RELEASES), key=order)
    for release in RELEASES:
        assert set(release) == {"version", "commit", "date"}
        assert len(release["commit"]) == 40


def test_each_recorded_commit_says_its_version() -> None:
    for release in RELEASES:
        def read(path: str, commit: str = release["commit"]) -> str | None:
            shown = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True,
                                   text=True, check=False)
            return shown.stdout if shown.returncode == 0 else None
        if read("agent/__init__.py") is None:
            pytest.skip(f"{release['commit'][:12]} is not in this clone (a shallow one)")
        assert disagreements(release["version"], versions(read)) == [], release


def test_main_carries_a_development_version_newer_than_every_release() -> None:
    assert ".dev" in __version__
    assert all(order(__version__) > order(r["version"]) for r in RELEASES)


def test_problems_are_each_named() -> None:
    found = problems("0.3.0", read=read_here, changelog="## [0.2.0] - 2027-01-01\n", dirty=" M agent/x.py\n",
                     on_branch=False, recorded=[{"version": "0.4.0"}])
    assert found[-4:] == ["CHANGELOG.md has no '## [0.3.0] - YYYY-MM-DD' section",
                          "the working tree has changes (M agent/x.py, ...): commit or stash them",
                          "the commit is not on the current branch",
                          "releases.json already has 0.4.0: a release must be newer"]
    assert f"agent/__init__.py says {__version__}, not 0.3.0" in found
    assert problems("0.2.0.dev0", read=read_here, changelog="", dirty="", on_branch=True, recorded=[]) == [
        "VERSION '0.2.0.dev0' is not X.Y.Z or X.Y.ZrcN"]


def release_cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "topology_devkit.release", "record", "--repo", str(repo), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with this one's version files at 1.2.0, a changelog with its section, no record yet."""
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(var, "t@example" if "EMAIL" in var else "t")
    root = tmp_path / "r"
    for path in ("agent/__init__.py", "pyproject.toml", CHART):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)
    (root / "agent/__init__.py").write_text('__version__ = "1.2.0"\n')
    chart = (root / CHART).read_text().replace(f"version: {semver(__version__)}", "version: 1.2.0")
    (root / CHART).write_text(chart.replace(f'appVersion: "{semver(__version__)}"', 'appVersion: "1.2.0"'))
    (root / "CHANGELOG.md").write_text("# Changelog\n\n## [Unreleased]\n\n## [1.2.0] - 2027-02-03\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "1.2.0")
    return root


def test_make_release_records_commits_and_tags(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    result = release_cli(repo, "--version", "1.2.0", "--date", "2027-02-04")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"recorded 1.2.0 at {head[:12]} in releases.json (tagged v1.2.0)")
    assert json.loads((repo / "releases.json").read_text()) == {
        "releases": [{"version": "1.2.0", "commit": head, "date": "2027-02-04"}]}
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "show", "--name-only", "--format=%s", "HEAD").splitlines() == [
        f"Release 1.2.0: recorded (commit {head[:12]}, 2027-02-04)", "", "releases.json"]
    assert git(repo, "rev-parse", "v1.2.0^{commit}") == head
    again = release_cli(repo, "--version", "1.2.0")
    assert again.returncode == 2 and "releases.json already has 1.2.0: a release must be newer" in again.stderr


def test_make_release_refuses_in_one_line_and_changes_nothing(repo: Path) -> None:
    (repo / "stray.txt").write_text("x")
    result = release_cli(repo, "--version", "1.2.1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("make release: ")
    assert "agent/__init__.py says 1.2.0, not 1.2.1" in result.stderr
    assert f"{CHART} version says 1.2.0, not 1.2.1" in result.stderr
    assert "CHANGELOG.md has no '## [1.2.1] - YYYY-MM-DD' section" in result.stderr
    assert "the working tree has changes (?? stray.txt, ...)" in result.stderr
    assert not (repo / "releases.json").exists() and git(repo, "tag") == ""


def test_make_release_records_an_earlier_commit_read_at_that_commit(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD")
    (repo / "agent/__init__.py").write_text('__version__ = "1.3.0.dev0"\n')
    git(repo, "commit", "-q", "-am", "dev")
    assert release_cli(repo, "--version", "1.2.0").returncode == 2
    result = release_cli(repo, "--version", "1.2.0", "--commit", first[:7])
    assert result.returncode == 0, result.stderr
    assert json.loads((repo / "releases.json").read_text())["releases"][0]["commit"] == first
    unknown = release_cli(repo, "--version", "1.2.5", "--commit", "0" * 40)
    assert unknown.returncode == 2 and "no commit" in unknown.stderr


def test_make_release_without_version_is_one_line_exit_2() -> None:
    # -o: the venv is taken as it is (a test never reinstalls it)
    result = subprocess.run(["make", "-s", "--no-print-directory", "-o", ".venv/.installed-dev", "release", "VERSION="],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert "make release: VERSION is required: make release VERSION=X.Y.Z [COMMIT=<commit>]" in result.stderr


def test_the_commit_from_a_checkout_a_baked_file_or_unknown(tmp_path: Path) -> None:
    package = tmp_path / "site" / "agent"
    (package / "data").mkdir(parents=True)
    info = package / "data" / "build.json"
    assert commit_of(package, info) == "unknown"  # a wheel built without the file
    info.write_text(json.dumps({"commit": "a" * 40}))
    assert commit_of(package, info) == "a" * 40
    info.write_text('{"commit": "$(rm -rf /)"}')
    assert commit_of(package, info) == "unknown"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert commit_of(REPO / "agent", info).startswith(head)  # a checkout: git wins over the file


def test_topology_agent_version_prints_version_and_commit() -> None:
    result = subprocess.run([sys.executable, "-m", "agent", "--version"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert result.stdout.startswith(f"topology-agent {__version__} (commit {head}")


def test_the_release_fixtures_are_what_the_release_itself_writes(tmp_path: Path) -> None:
    from topology_devkit.release_fixtures import FIXTURES, generate

    for release in RELEASES:
        if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", release["commit"]], check=False).returncode:
            pytest.skip(f"{release['commit'][:12]} is not in this clone (a shallow one)")
        out = tmp_path / release["version"]
        generate(release["version"], out)
        kept = FIXTURES / f"release-{release['version']}"
        files = sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
        for name in files:
            assert (out / name).read_bytes() == (kept / name).read_bytes(), name
