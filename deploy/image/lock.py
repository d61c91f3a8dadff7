#!/usr/bin/env python3
"""make image-lock: write the image's hashed requirements from pyproject.toml, then check them against the index.

    requirements.txt        the agent's runtime dependencies: pyproject.toml's [project] dependencies, no extra
    build-requirements.txt  the build backends the image runs: build-requirements.in

Both come from `uv pip compile --universal --python-version 3.11 --generate-hashes`. A universal resolution names
one version of each package for every platform (no environment markers came out of it), and uv writes the hash of
every file PyPI has for that version, so one file serves linux/amd64 and linux/s390x alike: pip picks the wheel (or,
for grpcio on s390x, the sdist) that fits and checks its hash. uv cannot resolve for s390x by itself (its
--python-platform has no s390x target), so the check below asks the index, for every pin, that:

  * every file of the pinned version has its hash in the lock (nothing pip might choose goes unhashed), and
  * linux/amd64 and linux/s390x each get a CPython 3.11 manylinux wheel (glibc <= 2.36, Debian bookworm's), or,
    for the packages the image compiles (grpcio on s390x), an sdist.

Runs in a throwaway venv that holds only uv and packaging (the Makefile makes it); needs PyPI. Exit 1 on any problem.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from packaging import tags
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
INDEX = "https://pypi.org/simple"
PYTHON = (3, 11)
GLIBC_MINOR = 36  # Debian bookworm, the base image's distribution
PLATFORMS = {"linux/amd64": "x86_64", "linux/s390x": "s390x"}
# Compiled from the sdist in the image, per platform (Dockerfile.s390x; PyPI has no s390x grpcio wheel).
FROM_SOURCE = {"linux/s390x": {"grpcio"}}
LOCKS = {
    "requirements.txt": "pyproject.toml",
    "build-requirements.txt": "deploy/image/build-requirements.in",
}
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def parse_lock(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (version, sha256 hashes) of a `uv pip compile --generate-hashes` file."""
    pins: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in text.splitlines():
        m = PIN.match(line)
        if m:
            name = canonicalize_name(m.group(1))
            pins[name] = (m.group(2), set())
        for digest in HASH.findall(line):
            pins[name][1].add(digest)
    return pins


def compile_lock(uv: str, source: str, output: str) -> None:
    cmd = [uv, "pip", "compile", "--quiet", "--no-config", "--universal", "--python-version", "3.11",
           "--generate-hashes", "--index-url", INDEX, "--custom-compile-command", "make image-lock",
           source, "--output-file", output]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)


def index_files(name: str) -> list[dict[str, object]]:
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files: list[dict[str, object]] = json.load(response)["files"]
    return files


def version_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[1])
        return str(parse_sdist_filename(filename)[1])
    except ValueError:
        return None


def supported(arch: str) -> set[tags.Tag]:
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(GLIBC_MINOR, 16, -1)] + [f"manylinux2014_{arch}"]
    if arch == "x86_64":
        platforms += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    found = set(tags.cpython_tags(PYTHON, abis=["cp311"], platforms=platforms))
    found |= set(tags.compatible_tags(PYTHON, "cp311", platforms=platforms))
    return found


def check(lock: str, pins: dict[str, tuple[str, set[str]]]) -> list[str]:
    problems: list[str] = []
    wanted = {platform: supported(arch) for platform, arch in PLATFORMS.items()}
    for name, (version, hashes) in sorted(pins.items()):
        before = len(problems)
        files = [f for f in index_files(name) if version_of(str(f["filename"])) == version and not f.get("yanked")]
        if not files:
            problems.append(f"{lock}: {name}=={version}: no such version on the index")
            continue
        digests = {str(f["hashes"]["sha256"]) for f in files if isinstance(f.get("hashes"), dict)}  # type: ignore[index]
        if digests - hashes:
            problems.append(f"{lock}: {name}=={version}: {len(digests - hashes)} of {len(digests)} files unhashed")
        wheels = [str(f["filename"]) for f in files if str(f["filename"]).endswith(".whl")]
        has_sdist = any(not str(f["filename"]).endswith(".whl") for f in files)
        for platform, accepted in wanted.items():
            if name in FROM_SOURCE.get(platform, set()):
                if not has_sdist:
                    problems.append(f"{lock}: {name}=={version}: no sdist to compile for {platform}")
                continue
            if not any(parse_wheel_filename(w)[3] & accepted for w in wheels):
                problems.append(f"{lock}: {name}=={version}: no CPython 3.11 wheel for {platform}")
        verdict = "; ".join(problems[before:]) or f"{len(files)} files, all hashed, amd64 and s390x covered"
        print(f"  {'ok' if len(problems) == before else '!!'} {name}=={version}: {verdict}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uv", default="uv", help="the uv executable (default: uv on PATH)")
    parser.add_argument("--check-only", action="store_true", help="check the committed locks, write nothing")
    args = parser.parse_args(argv)
    problems: list[str] = []
    for lock, source in LOCKS.items():
        path = HERE / lock
        if not args.check_only:
            compile_lock(args.uv, source, str(path.relative_to(REPO)))
        print(f"== {path.relative_to(REPO)}", flush=True)
        problems += check(lock, parse_lock(path.read_text()))
    for problem in problems:
        print(f"image-lock: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
