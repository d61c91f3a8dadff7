"""Compare the agent's groups with lscpu on every real s390x dump (run by tools/s390x-smoke.sh).

Runs inside the s390x chroot (and once on the build host, for the endianness cross-check); needs
only the standard library, the ``agent`` package and ``lscpu`` (util-linux). For each host root
found under ``--fixtures`` (a directory holding ``sys/devices/system/cpu``) it:

1. groups the topology read from sysfs (``--source sysfs``, the DaemonSet's default path);
2. groups the topology read by running *this* machine's ``lscpu --sysroot`` (``--source lscpu``)
   and checks both give the same devices (resource and CPU set);
3. checks the groups against the raw ``lscpu --sysroot ROOT -a -y -e=...`` table, independently of
   the agent's lscpu parser: every group's CPUs are online and sit in one lscpu container of the
   group's level, no two groups share a container, a group holds all online CPUs of its container
   that the agent did not list as skipped, and every CPU is either in a group or skipped;
4. writes the ``discover --format json`` document to ``--out/<name>.json`` so the shell script can
   compare the s390x (big-endian, emulated) result with the host's byte for byte.

Exit status 0 when every dump agrees, 1 otherwise. One summary line per dump.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.errors import TopologyReadError
from agent.observe.report import grouping_dict
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.source import load_topology

LSCPU_COLUMNS = ("CPU", "CORE", "SOCKET", "BOOK", "DRAWER", "ONLINE")
LevelKey = tuple[int | None, ...]


def host_roots(fixtures: Path) -> list[Path]:
    """Every directory under ``fixtures`` that looks like a host root (has sys/devices/system/cpu)."""
    return sorted(p.parent.parent.parent.parent for p in fixtures.rglob("sys/devices/system/cpu") if p.is_dir())


def dump_name(root: Path, fixtures: Path) -> str:
    return str(root.relative_to(fixtures)).replace(os.sep, "__")


def lscpu_table(root: Path) -> dict[int, dict[str, Any]]:
    """``lscpu --sysroot ROOT -a -y -e=...``: kernel ids (``-y``), offline CPUs too (``-a``)."""
    argv = ["lscpu", "--sysroot", str(root), "-a", "-y", "-e=" + ",".join(LSCPU_COLUMNS)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=dict(os.environ, LC_ALL="C")).stdout
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header, rows = lines[0], lines[1:]
    if tuple(header) != LSCPU_COLUMNS:
        raise RuntimeError(f"unexpected lscpu header {header}")
    table: dict[int, dict[str, Any]] = {}
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        table[int(cells["CPU"])] = {
            "core": None if cells["CORE"] == "-" else int(cells["CORE"]),
            "socket": None if cells["SOCKET"] == "-" else int(cells["SOCKET"]),
            "book": None if cells["BOOK"] == "-" else int(cells["BOOK"]),
            "drawer": None if cells["DRAWER"] == "-" else int(cells["DRAWER"]),
            "online": cells["ONLINE"] == "yes",
        }
    return table


def level_key(row: dict[str, Any], level: str) -> LevelKey:
    if level == "drawer":
        return (row["drawer"],)
    if level == "book":
        return (row["drawer"], row["book"])
    return (row["drawer"], row["book"], row["socket"])


def check_against_lscpu(doc: dict[str, Any], table: dict[int, dict[str, Any]]) -> list[str]:
    """Problems found when laying the agent's groups over lscpu's own table (empty: agreement)."""
    problems: list[str] = []
    skipped = {cpu for s in doc["skipped"] for cpu in s["cpus"]}
    grouped: dict[int, str] = {}
    owner: dict[LevelKey, str] = {}
    for group in doc["groups"]:
        gid, level, cpus = group["id"], group["level"], set(group["cpus"])
        missing = sorted(c for c in cpus if c not in table)
        if missing:
            problems.append(f"{gid}: CPUs {missing} not listed by lscpu")
            continue
        offline = sorted(c for c in cpus if not table[c]["online"])
        if offline:
            problems.append(f"{gid}: CPUs {offline} are offline according to lscpu")
        keys = {level_key(table[c], level) for c in cpus}
        if len(keys) != 1:
            problems.append(f"{gid}: CPUs span {len(keys)} lscpu {level}s {sorted(keys, key=str)}")
            continue
        key = keys.pop()
        if key[-1] is None:
            problems.append(f"{gid}: lscpu shows no {level} id for its CPUs")
        if key in owner:
            problems.append(f"{gid} and {owner[key]} are the same lscpu {level} {key}")
        owner[key] = gid
        container = {c for c, row in table.items() if row["online"] and level_key(row, level) == key}
        expected = container - skipped
        if expected != cpus:
            problems.append(f"{gid}: CPUs {sorted(cpus)} but lscpu {level} {key} has usable {sorted(expected)}")
        for c in cpus:
            if c in grouped:
                problems.append(f"CPU {c} is in {grouped[c]} and {gid}")
            grouped[c] = gid
    unaccounted = sorted(set(table) - set(grouped) - skipped)
    if unaccounted:
        problems.append(f"CPUs {unaccounted} are neither advertised nor listed as skipped")
    return problems


def devices(doc: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((g["resource"], tuple(g["cpus"])) for g in doc["groups"])


def check_root(root: Path, name: str, out: Path | None) -> tuple[bool, str]:
    settings = GroupingSettings().validated()
    try:
        topo = load_topology(root, source="sysfs")
    except TopologyReadError as exc:
        return False, f"sysfs read failed: {exc}"
    doc = grouping_dict(topo, group_topology(topo, settings))
    if out is not None:
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    problems: list[str] = []
    try:
        via_lscpu = load_topology(root, source="lscpu")
        doc_lscpu = grouping_dict(via_lscpu, group_topology(via_lscpu, settings))
        if devices(doc_lscpu) != devices(doc):
            problems.append(f"--source lscpu gives {devices(doc_lscpu)}, --source sysfs gives {devices(doc)}")
    except TopologyReadError as exc:
        problems.append(f"--source lscpu failed: {exc}")
    try:
        problems += check_against_lscpu(doc, lscpu_table(root))
    except (subprocess.CalledProcessError, RuntimeError, ValueError) as exc:
        problems.append(f"lscpu table: {exc}")
    summary = (f"{doc['machine'].get('generation') or doc['machine'].get('machine_type') or '?'}, "
               f"levels {','.join(doc['levels']) or 'none'}, {len(doc['groups'])} group(s), "
               f"{sum(len(s['cpus']) for s in doc['skipped'])} CPU(s) not advertised")
    if problems:
        return False, summary + "\n      " + "\n      ".join(problems)
    return True, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, required=True, help="directory holding the real dumps")
    parser.add_argument("--out", type=Path, default=None, help="write each discover JSON document here")
    args = parser.parse_args(argv)
    roots = host_roots(args.fixtures)
    if not roots:
        print(f"no host roots (sys/devices/system/cpu) under {args.fixtures}", file=sys.stderr)
        return 1
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    lscpu_version = subprocess.run(["lscpu", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"machine {platform.machine()}, byteorder {sys.byteorder}, python {platform.python_version()}, "
          f"{lscpu_version}")
    failures = 0
    for root in roots:
        name = dump_name(root, args.fixtures)
        ok, text = check_root(root, name, args.out)
        failures += not ok
        print(f"  {'OK  ' if ok else 'FAIL'} {name}: {text}")
    print(f"{len(roots) - failures}/{len(roots)} dumps agree with lscpu")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
