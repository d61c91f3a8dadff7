"""NodePrepareResources and NodeUnprepareResources: a ResourceClaim's allocation -> CDI spec files, checkpointed.

Per request of this driver's results for this node's pool, the container environment is planned as in device-plugin
mode (:func:`agent.policy.allocation.plan_allocation`) and written as one CDI device whose env also carries
``TOPOLOGY_DRA_CLAIM=<claim uid>/<request>`` (the NRI hooks read it); the CDI ids go back to the kubelet per device.

Must hold: an admin-access request is observed only (no binding variables, no claim variable, held by nobody); a claim
on devices the other mode holds, or overlapping them, is refused; what was prepared is checkpointed (atomically)
before the answer goes out, so a repeated prepare answers from the checkpoint; unpreparing an unknown claim succeeds;
no CDI file outlives its claim; and a preparer that refuses new claims (device-plugin mode, serving unprepares only)
still answers those it holds. Why and how: docs/contributing/design/dra-claims.md."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.atomic import write_atomically
from agent.errors import NewerStateError, one_line
from agent.policy.allocation import AllocationSettings, plan_allocation
from agent.policy.container_claims import ADMIN_ENV, CLAIM_ENV, PreparedRequest, claim_value
from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey, Holder, claim_holder
from agent.policy.state_codec import newer_refusal

log = logging.getLogger("topology-agent.dra")

CHECKPOINT_SUBPATH = "s390x-topology-agent/dra/claims.json"  # under the kubelet directory the state files use
CDI_VERSION = "0.6.0"  # env-only specs need 0.3.0; 0.6.0 is what containerd 1.7 and 2.x both read
CHECKPOINT_VERSION = 1
MAX_CHECKPOINT = 4 * 1024 * 1024

JSON = dict[str, Any]


class PrepareError(Exception):
    """A claim that cannot be prepared: the message goes back to the kubelet in the claim's error field, as one line
    whatever the claim holds."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    admin: bool = False  # allocated with admin access: observed, never held or pinned


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    files: Mapping[str, JSON]  # file name -> the CDI spec written there

    def to_json(self) -> JSON:
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name,
                "devices": [{"request": d.request, "pool": d.pool, "device": d.device, "cdiIds": list(d.cdi_ids),
                             **({"adminAccess": True} if d.admin else {})} for d in self.devices],
                "files": dict(self.files)}

    @classmethod
    def from_json(cls, doc: JSON) -> PreparedClaim:
        """The claim :meth:`to_json` wrote; TypeError for a field of another type (nothing is coerced: a checkpoint
        with one is not the agent's, and is not trusted)."""
        return cls(uid=_text(doc, "uid"), namespace=_text(doc, "namespace"), name=_text(doc, "name"),
                   devices=tuple(PreparedDevice(_text(d, "request"), _text(d, "pool"), _text(d, "device"),
                                                tuple(_texts(d["cdiIds"])), d.get("adminAccess") is True)
                                 for d in _objects(doc["devices"])),
                   files={k: v for k, v in _object(doc["files"]).items() if _texts([k])})

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _field(doc: Any, key: str, kind: type = dict) -> Any:
    """``doc[key]`` when it is a ``kind`` (absent or null: an empty one); PrepareError for another type (the API
    server's schema rules it out, so it is refused rather than guessed at)."""
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        return kind()
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise PrepareError(f"the claim's {key} is {type(value).__name__}, not {expected}")
    return value


def _text(doc: JSON, key: str) -> str:
    value = doc[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is {type(value).__name__}, not a string")
    return value


def _texts(values: Any) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError("expected a list of strings")
    return values


def _objects(values: Any) -> list[JSON]:
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        raise TypeError("expected a list of objects")
    return values


def _object(value: Any) -> JSON:
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    return value


def cdi_name(text: str) -> str:
    """A CDI device name from a claim uid and request (``[A-Za-z0-9][A-Za-z0-9_.:-]*``)."""
    return "".join(ch if ch.isalnum() or ch in "-_.:" else "_" for ch in text)


def plan_claim(claim: JSON, *, driver: str, pool: str, groups: Mapping[str, Group],
               allocation: AllocationSettings) -> tuple[tuple[PreparedDevice, ...], dict[str, JSON]]:
    """The devices (with CDI ids) and the CDI spec files of an allocated claim. Pure."""
    meta = _field(claim, "metadata")
    uid = str(meta.get("uid") or "")
    results = _field(_field(_field(_field(claim, "status"), "allocation"), "devices"), "results", list)
    if not all(isinstance(r, dict) and isinstance(r.get("request"), str) for r in results):
        raise PrepareError(f"claim {meta.get('namespace')}/{meta.get('name')}: status.allocation.devices.results "
                           "holds an entry that is not a device result with a request name")
    ours = [r for r in results if r.get("driver") == driver]
    if not ours:
        raise PrepareError(f"claim {meta.get('namespace')}/{meta.get('name')} has no device of driver {driver} "
                           "allocated (not allocated yet, or to another driver)")
    by_request: dict[str, list[Group]] = {}
    admin = {str(r.get("request")) for r in ours if r.get("adminAccess") is True}
    for r in ours:
        if r.get("pool") != pool:
            raise PrepareError(f"device {r.get('device')} is in pool {r.get('pool')}, not this node's pool {pool}")
        group = groups.get(str(r.get("device")))
        if group is None:
            raise PrepareError(f"device {r.get('device')} is not one this node publishes (published: "
                               f"{', '.join(sorted(groups)[:8])}{', ...' if len(groups) > 8 else ''})")
        by_request.setdefault(str(r.get("request")), []).append(group)
    files: dict[str, JSON] = {}
    cdi_of: dict[str, str] = {}
    for request, members in by_request.items():
        levels = {g.level for g in members}
        level = levels.pop() if len(levels) == 1 else "group"
        plan = plan_allocation(members, allocation)
        name = cdi_name(f"{uid}-{request}")
        kind = f"{driver}/{level}"
        file_name = f"{driver}-{level}_{uid}.json"
        spec = files.setdefault(file_name, {"cdiVersion": CDI_VERSION, "kind": kind, "devices": []})
        if request in admin:  # to observe, not to run on: what it is, nothing to bind to, no claim to pin by
            env = [f"{k}={plan.envs[k]}" for k in ("TOPOLOGY_GROUPS", "TOPOLOGY_CPUS")] + [f"{ADMIN_ENV}=true"]
        else:
            env = [f"{k}={v}" for k, v in plan.envs.items()] + [f"{CLAIM_ENV}={claim_value(uid, request)}"]
        spec["devices"].append({"name": name, "containerEdits": {"env": env}})
        cdi_of[request] = f"{kind}={name}"
    devices = tuple(PreparedDevice(str(r["request"]), str(r["pool"]), str(r["device"]), (cdi_of[str(r["request"])],),
                                   str(r["request"]) in admin) for r in ours)
    return devices, files


def with_claim_env(claim: PreparedClaim) -> PreparedClaim:
    """A claim prepared by an agent that did not write ``TOPOLOGY_DRA_CLAIM`` yet, with it added to every CDI device
    that lacks it (the device's request is found by its CDI id); the same claim when nothing lacks it. Pure."""
    request_of = {cdi_id.rsplit("=", 1)[-1]: d.request for d in claim.devices for cdi_id in d.cdi_ids if not d.admin}
    files: dict[str, JSON] = {}
    changed = False
    for file_name, spec in claim.files.items():
        devices = []
        for device in spec.get("devices") or []:
            edits = device.get("containerEdits") or {}
            env = list(edits.get("env") or [])
            request = request_of.get(str(device.get("name")))
            if request is not None and not any(e.startswith(f"{CLAIM_ENV}=") for e in env):
                env.append(f"{CLAIM_ENV}={claim_value(claim.uid, request)}")
                device = {**device, "containerEdits": {**edits, "env": env}}
                changed = True
            devices.append(device)
        files[file_name] = {**spec, "devices": devices}
    return PreparedClaim(claim.uid, claim.namespace, claim.name, claim.devices, files) if changed else claim


def request_index(claims: Mapping[str, PreparedClaim], groups: Mapping[str, Group]) -> dict[str, PreparedRequest]:
    """``<claim uid>/<request>`` -> its namespace and devices (``(resource, id)``; a device no longer published, or
    held with admin access, is left out). Pure."""
    index: dict[str, PreparedRequest] = {}
    for claim in claims.values():
        by_request: dict[str, list[tuple[str, str]]] = {}
        for d in claim.devices:
            keys = by_request.setdefault(d.request, [])
            if d.device in groups and not d.admin:
                keys.append((groups[d.device].resource, d.device))
        for request, keys in by_request.items():
            index[claim_value(claim.uid, request)] = PreparedRequest(claim.namespace, claim.name, tuple(keys))
    return index


def claim_holds(claims: Mapping[str, PreparedClaim], groups: Mapping[str, Group]) -> dict[DeviceKey, frozenset[Holder]]:
    """Every device the prepared claims hold (admin access holds nothing) -> the claims holding it. Pure."""
    holds: dict[DeviceKey, set[Holder]] = {}
    for claim in claims.values():
        for d in claim.devices:
            if d.device in groups and not d.admin:
                holds.setdefault((groups[d.device].resource, d.device), set()).add(claim_holder(claim.ref))
    return {key: frozenset(holders) for key, holders in holds.items()}


def admin_devices(claims: Mapping[str, PreparedClaim]) -> frozenset[tuple[str, str, str]]:
    """(claim namespace, claim name, device) of every device held with admin access: pod-resources' claim rows
    of these are observers, not holders. Pure."""
    return frozenset((c.namespace, c.name, d.device) for c in claims.values() for d in c.devices if d.admin)


def checkpoint_path(kubelet_dir: Path) -> Path:
    """Where DRA mode keeps its prepared claims (read in both modes: a claim holds its devices in either)."""
    return Path(kubelet_dir) / CHECKPOINT_SUBPATH


def cdi_file_uid(file_name: str, driver: str) -> str | None:
    """The claim uid of a CDI spec file this driver writes (``<driver>-<level>_<claim uid>.json``), or None for any
    other file. Pure."""
    if not file_name.startswith(f"{driver}-") or not file_name.endswith(".json"):
        return None
    level, sep, uid = file_name[len(driver) + 1:-len(".json")].rpartition("_")
    return uid if sep and level and uid else None


def remove_cdi_files(cdi_dir: Path, driver: str, keep: Callable[[str], bool]) -> list[str]:
    """Remove this driver's CDI spec files in ``cdi_dir`` whose claim uid ``keep`` refuses; the names removed (a
    directory that cannot be read removes nothing; one warning per file that cannot be removed)."""
    try:
        names = sorted(entry.name for entry in Path(cdi_dir).iterdir())
    except OSError:
        return []
    removed = []
    for name in names:
        uid = cdi_file_uid(name, driver)
        if uid is None or keep(uid):
            continue
        try:
            (Path(cdi_dir) / name).unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove the CDI file %s of claim %s (%s)", name, uid, exc)
            continue
        removed.append(name)
    return removed


def remove_claim_files(cdi_dir: Path, claim: PreparedClaim) -> None:
    """Remove the CDI spec files a prepared claim wrote (one already gone is fine)."""
    for name in claim.files:
        with contextlib.suppress(FileNotFoundError):
            (Path(cdi_dir) / name).unlink()


def read_checkpoint(path: Path) -> dict[str, PreparedClaim]:
    """The prepared claims saved at ``path`` by uid, as saved ({} when there is none; a file that cannot be trusted is
    said and not used)."""
    return load_checkpoint(path) or {}


def load_checkpoint(path: Path) -> dict[str, PreparedClaim] | None:
    """As :func:`read_checkpoint`, but None when a checkpoint is there and cannot be read or trusted ({} only when
    there is none), so that nothing is cleaned up on the strength of a checkpoint that was not read. A checkpoint of
    a newer format is NewerStateError: the agent stops before it could write over it."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read the DRA checkpoint %s (%s): starting without prepared claims", path, exc)
        return None
    try:
        if len(raw) > MAX_CHECKPOINT:
            raise ValueError("too large")
        doc = json.loads(raw)
        version = doc.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > CHECKPOINT_VERSION:
            raise newer_refusal(path, NewerStateError(
                f"the DRA checkpoint is format version {version}, newer than this agent reads ({CHECKPOINT_VERSION})"))
        if version != CHECKPOINT_VERSION:
            raise ValueError(f"version {doc.get('version')!r}")
        claims = [PreparedClaim.from_json(c) for c in _objects(doc["claims"])]
        return {c.uid: c for c in claims}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:200]
        log.warning("the DRA checkpoint %s cannot be trusted (%s): not used", path, reason)
        return None


def forget_claims(path: Path, uids: Iterable[str], cdi_dir: Path | None = None) -> list[str]:
    """Device-plugin mode: drop claims from the checkpoint at ``path`` once pod-resources no longer lists their
    containers (the pods went while no DRA plugin ran, so kubelet could not unprepare them; it does once one runs
    again, and unpreparing a claim the checkpoint does not know succeeds), and remove their CDI spec files from
    ``cdi_dir`` (no container of theirs is left to start with them). The uids removed; an unreadable or unwritable
    checkpoint is left as it is (one warning)."""
    drop = set(uids)
    claims = read_checkpoint(path)
    gone = sorted(uid for uid in claims if uid in drop)
    if not gone:
        return []
    doc = {"version": CHECKPOINT_VERSION,
           "claims": [c.to_json() for uid, c in claims.items() if uid not in drop]}
    try:
        write_atomically(Path(path), json.dumps(doc, sort_keys=True).encode())
    except OSError as exc:
        log.warning("cannot forget released claims in the DRA checkpoint %s (%s)", path, exc)
        return []
    for uid in gone:
        c = claims[uid]
        if cdi_dir is not None:
            remove_claim_files(cdi_dir, c)
        log.info("forgot claim %s/%s (%s) in the DRA checkpoint: pod-resources lists none of its containers any more",
                 c.namespace, c.name, uid)
    return gone


class ClaimPreparer:
    """The prepare/unprepare logic behind both DRAPlugin versions (thread-safe)."""

    def __init__(self, *, driver: str, pool: str, groups: Mapping[str, Group], allocation: AllocationSettings,
                 read_claim: Callable[[str, str], JSON], cdi_dir: Path, checkpoint: Path,
                 check: Callable[[Sequence[DeviceKey]], str | None] | None = None) -> None:
        self.driver = driver
        self.check = check  # why devices must not be prepared now (held by the other mode), or None
        self.pool = pool
        self.groups = groups
        self.allocation = allocation
        self.read_claim = read_claim
        self.cdi_dir = Path(cdi_dir)
        self.checkpoint = Path(checkpoint)
        self._lock = threading.Lock()
        self.claims: dict[str, PreparedClaim] = self._load()
        self._requests: dict[str, PreparedRequest] = request_index(self.claims, self.groups)
        self.on_change: Callable[[], None] | None = None  # after a claim was prepared or unprepared (must not block)
        self.refuse_new: str | None = None  # why claims it does not hold are refused (None: prepared from the API)
        self.prepares = 0  # claims prepared from the API (not from the checkpoint)
        self.unprepares = 0

    # --- checkpoint ------------------------------------------------------------------------------
    def _load(self) -> dict[str, PreparedClaim]:
        restored = load_checkpoint(self.checkpoint)
        if restored is None:
            return {}
        for name in remove_cdi_files(self.cdi_dir, self.driver, keep=restored.__contains__):
            log.info("removed the CDI file %s: the DRA checkpoint holds no such claim", name)
        if not restored:
            return {}
        claims = {uid: with_claim_env(c) for uid, c in restored.items()}
        log.info("restored %d prepared claim(s) from %s", len(claims), self.checkpoint)
        for uid, claim in claims.items():
            if claim is not restored[uid]:  # from an agent before TOPOLOGY_DRA_CLAIM: its CDI files get it now
                try:
                    self._write_files(claim)
                except OSError as exc:
                    log.warning("cannot rewrite the CDI files of claim %s/%s (%s): its new containers are pinned "
                                "once pod-resources lists them", claim.namespace, claim.name, exc)
        return claims

    def _commit(self, claims: dict[str, PreparedClaim]) -> None:
        """Save ``claims`` as the checkpoint, then make them (and the request index) the agent's: a failed save
        changes nothing in memory, so what the NRI hook believes is always what the checkpoint holds (the call
        fails and kubelet retries it). Under ``self._lock``."""
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": CHECKPOINT_VERSION, "claims": [c.to_json() for c in claims.values()]}
        write_atomically(self.checkpoint, json.dumps(doc, sort_keys=True).encode())
        self.claims = claims
        self._requests = request_index(claims, self.groups)

    # --- CDI files -----------------------------------------------------------------------------
    def _write_files(self, claim: PreparedClaim) -> None:
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        for name, spec in claim.files.items():
            path = self.cdi_dir / name
            data = json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n"
            try:
                if path.read_bytes() == data:
                    continue
            except OSError:
                pass
            write_atomically(path, data)

    # --- the calls -----------------------------------------------------------------------------
    def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        with self._lock:
            known = self.claims.get(uid)
            if known is not None:
                self._write_files(known)  # idempotent; restores a file somebody removed
                return known
        if self.refuse_new is not None:
            raise PrepareError(f"claim {namespace}/{name} cannot be prepared: {self.refuse_new}")
        claim = self.read_claim(namespace, name)
        got = str((claim.get("metadata") or {}).get("uid") or "")
        if got != uid:
            raise PrepareError(f"claim {namespace}/{name} has uid {got or '(none)'}, not {uid}: it was replaced")
        devices, files = plan_claim(claim, driver=self.driver, pool=self.pool, groups=self.groups,
                                    allocation=self.allocation)
        if self.check is not None:
            why = self.check([(self.groups[d.device].resource, d.device) for d in devices if not d.admin])
            if why is not None:
                raise PrepareError(f"claim {namespace}/{name} cannot be prepared: {why}; its CPUs would have two "
                                   "holders (the device is tainted in the node's ResourceSlices until that holder "
                                   "is gone)")
        prepared = PreparedClaim(uid, namespace, name, devices, files)
        with self._lock:
            known = self.claims.get(uid)
            if known is not None:
                return known
            self._write_files(prepared)
            self._commit({**self.claims, uid: prepared})
            self.prepares += 1
        log.info("prepared claim %s/%s (%s): %s", namespace, name, uid,
                 ", ".join(f"{d.device} for {d.request}" for d in devices))
        self._changed()
        return prepared

    def unprepare(self, uid: str) -> None:
        with self._lock:
            claim = self.claims.get(uid)
            if claim is None:  # forgotten meanwhile (device-plugin mode, or a lost checkpoint): its files go too
                for name in remove_cdi_files(self.cdi_dir, self.driver, keep=lambda other: other != uid):
                    log.info("unprepared claim %s, which the checkpoint does not hold: removed its CDI file %s",
                             uid, name)
                return
            remove_claim_files(self.cdi_dir, claim)
            self._commit({k: v for k, v in self.claims.items() if k != uid})
            self.unprepares += 1
        log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, uid)
        self._changed()

    def forget(self, uids: Iterable[str]) -> list[str]:
        """Drop claims none of whose containers is left (device-plugin mode: pod-resources lists none of them), with
        their CDI files, as :func:`forget_claims` does to the file; the uids of ``uids`` it holds no more (forgotten
        now or before; none when the checkpoint cannot be written)."""
        asked = set(uids)
        with self._lock:
            gone = {uid: c for uid, c in self.claims.items() if uid in asked}
            if gone:
                try:
                    self._commit({k: v for k, v in self.claims.items() if k not in asked})
                except OSError as exc:
                    log.warning("cannot forget released claims in the DRA checkpoint %s (%s)", self.checkpoint, exc)
                    return []
                for c in gone.values():
                    remove_claim_files(self.cdi_dir, c)
            left = sorted(asked - set(self.claims))
        for uid, c in sorted(gone.items()):
            log.info("forgot claim %s/%s (%s) in the DRA checkpoint: pod-resources lists none of its containers any "
                     "more", c.namespace, c.name, uid)
        if gone:
            self._changed()
        return left

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def requests(self) -> Mapping[str, PreparedRequest]:
        """Every prepared claim's requests by ``<claim uid>/<request>``, from memory (no I/O, no lock: the mapping
        is replaced, never changed, so the NRI hook reads it as it is)."""
        return self._requests

    def holds(self) -> dict[DeviceKey, frozenset[Holder]]:
        """Every device the prepared claims hold, with the claims (admin access holds nothing)."""
        with self._lock:
            return claim_holds(self.claims, self.groups)

    def admin_devices(self) -> frozenset[tuple[str, str, str]]:
        """(claim namespace, claim name, device) held with admin access (observers, not holders)."""
        return admin_devices(self.claims)

    def prepared_devices(self) -> dict[str, list[tuple[str, str]]]:
        """Claim uid -> the (pool, device) it holds."""
        with self._lock:
            return {uid: [(d.pool, d.device) for d in c.devices] for uid, c in self.claims.items()}
