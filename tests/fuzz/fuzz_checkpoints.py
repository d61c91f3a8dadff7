"""Door: files on the node the agent reads back. Its own state files (the advertised groups, the holds), the DRA
checkpoint of prepared claims, kubelet's ``cpu_manager_state`` and kubelet config. Each is written as the writer
writes it, then mutated (values replaced, deleted, duplicated), cut short, or made huge. Right answer: the unchanged
file reads back as what was written. Refusal: the state files and the DRA checkpoint are then not trusted (None, or
no holds), or, with a whole-number version above the agent's, NewerStateError (one line: the agent stops and keeps
the file); kubelet's files raise CpuManagerStateError / KubeletConfigError, one line.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from agent.devices.persist import StateFiles
from agent.dra.prepare import CHECKPOINT_VERSION, PreparedClaim, load_checkpoint, plan_claim
from agent.errors import CpuManagerStateError, KubeletConfigError, NewerStateError
from agent.node.cpu_manager import parse_cpu_manager_state, read_reserved_system_cpus
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import Grouping, GroupingSettings, group_topology
from agent.policy.ledger import SavedHolds
from agent.policy.resource_slices import DRIVER
from agent.topology.embedded import load_embedded
from tests.fuzz.common import door, refused
from tests.fuzz.mutate import json_values, mangled_text, mutated_json

SETTINGS = GroupingSettings()
TOPOLOGY = load_embedded("z16-lpar")
GROUPING = group_topology(TOPOLOGY, SETTINGS)
PRESENT = [c.cpu for c in TOPOLOGY.cpus]
KNOWN = [(g.resource, g.id) for g in GROUPING.groups]
DIR = Path(tempfile.mkdtemp(prefix="fuzz-state-"))

# A cpulist that takes long or much memory to expand: many wide ranges, repeated.
huge_cpulists = st.sampled_from(["0-999999," * 200 + "0", ",".join(["0-999999"] * 50), "0-1000000",
                                 "0-" + "9" * 400, "1" * 5000, ",".join(str(i) for i in range(20000))])


def write(name: str, text: str | bytes) -> Path:
    path = DIR / name
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return path


def check_grouping(grouping: Grouping) -> None:
    """A grouping read back names only present CPUs, and no CPU twice within one resource."""
    for resource in grouping.resources():
        seen: set[int] = set()
        for group in grouping.by_resource(resource):
            assert set(group.cpus) <= set(PRESENT), group
            assert not seen & set(group.cpus), group
            seen |= set(group.cpus)


@door("state-files", "checkpoints", st.data())
def state_files(data: st.DataObject) -> None:
    files = StateFiles(DIR / "kubelet", SETTINGS)
    files.save_groups(GROUPING)
    holds = SavedHolds(frozenset(KNOWN[:3]), {KNOWN[0]: frozenset({("ns", "pod")})})
    files.save_holds(holds)
    assert files.load_groups(PRESENT) is not None and files.load_holds(KNOWN) == holds  # the right answer
    for path in (files.groups_path, files.holds_path):
        doc = json.loads(path.read_text())
        path.write_text(data.draw(mangled_text(json.dumps(data.draw(mutated_json(doc))))))
    try:
        grouping = files.load_groups(PRESENT)  # a file not trusted is None
        if grouping is not None:
            check_grouping(grouping)
        read = files.load_holds(KNOWN)
        assert isinstance(read, SavedHolds) and read.keys <= set(KNOWN)
    except NewerStateError as exc:
        newer(exc, files.groups_path, files.holds_path)


def newer(exc: NewerStateError, *paths: Path) -> None:
    """A refusal for a newer format: one line naming the file, whose version is a whole number above 1."""
    message = str(exc)
    assert "\n" not in message and "newer than this agent reads" in message, message
    path = next(p for p in paths if message.startswith(f"{p}: "))
    version = json.loads(path.read_text()).get("version")
    assert isinstance(version, int) and not isinstance(version, bool) and version > 1, version


def prepared_claims() -> dict[str, PreparedClaim]:
    groups = {g.id: g for g in GROUPING.by_resource("topology/book")}
    claims = {}
    for n, ids in enumerate((list(groups)[:1], list(groups)[1:3])):
        claim = {"metadata": {"uid": f"uid-{n}", "namespace": "ns", "name": f"c{n}"},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "r", "driver": DRIVER, "pool": "node", "device": i} for i in ids]}}}}
        devices, files = plan_claim(claim, driver=DRIVER, pool="node", groups=groups,
                                    allocation=AllocationSettings())
        claims[f"uid-{n}"] = PreparedClaim(f"uid-{n}", "ns", f"c{n}", devices, files)
    return claims


CLAIMS = prepared_claims()
CHECKPOINT = {"version": CHECKPOINT_VERSION, "claims": [c.to_json() for c in CLAIMS.values()]}


@door("dra-checkpoint", "checkpoints", st.data())
def dra_checkpoint(data: st.DataObject) -> None:
    doc = data.draw(mutated_json(CHECKPOINT, 4))
    text = data.draw(mangled_text(json.dumps(doc)))
    if data.draw(st.integers(0, 20)) == 0:
        text = "[" * data.draw(st.integers(900, 100000)) + text  # nested past the parser's recursion limit
    path = write("claims.json", text)
    try:
        claims = load_checkpoint(path)  # a checkpoint not trusted is None
    except NewerStateError as exc:
        newer(exc, path)
        return
    if text == json.dumps(CHECKPOINT):
        assert claims == CLAIMS
    if claims is not None:
        assert all(isinstance(c, PreparedClaim) and uid == c.uid for uid, c in claims.items())


def cpu_manager_doc(static: bool) -> dict[str, Any]:
    if not static:
        return {"policyName": "none", "defaultCpuSet": "", "checksum": 1353318690}
    return {"policyName": "static", "defaultCpuSet": "0-1,6-63", "entries": {
        "pod-uid-1": {"app": "2-5"}}, "checksum": 3823457361}


@door("cpu-manager-state", "checkpoints", st.booleans(), st.data())
def cpu_manager_state(static: bool, data: st.DataObject) -> None:
    doc = data.draw(mutated_json(cpu_manager_doc(static)))
    if data.draw(st.integers(0, 10)) == 0:
        doc = {**cpu_manager_doc(static), "defaultCpuSet": data.draw(huge_cpulists)}
    text = data.draw(mangled_text(json.dumps(doc)))
    if data.draw(st.integers(0, 20)) == 0:
        text = "[" * data.draw(st.integers(900, 100000)) + text
    answer = refused(lambda: parse_cpu_manager_state(text), CpuManagerStateError)
    if text == json.dumps(cpu_manager_doc(static)):
        assert not isinstance(answer, BaseException) and answer.policy == ("static" if static else "none")


KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: none
reservedSystemCPUs: "0-1"
"""


@door("kubelet-config", "checkpoints", st.data())
def kubelet_config(data: st.DataObject) -> None:
    how = data.draw(st.sampled_from(["text", "value", "bomb", "deep"]))
    if how == "text":
        text = data.draw(mangled_text(KUBELET_CONFIG))
    elif how == "value":
        value = data.draw(json_values | huge_cpulists)
        text = KUBELET_CONFIG.replace('"0-1"', json.dumps(value))
    elif how == "bomb":  # aliases that expand exponentially
        levels = data.draw(st.integers(1, 12))
        lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
        lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
        text = "\n".join(lines) + "\nreservedSystemCPUs: '0'\n"
    else:
        text = "reservedSystemCPUs: " + "[" * data.draw(st.integers(100, 100000))
    path = write("config.yaml", text)
    answer = refused(lambda: read_reserved_system_cpus(path), KubeletConfigError)
    if text == KUBELET_CONFIG:
        assert answer == (0, 1)
