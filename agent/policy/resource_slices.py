"""What DRA mode publishes: a node's ResourceSlices as plain data (the ``resource.k8s.io/v1`` JSON shape). Pure.

One pool per node: counter slices (a counter set per drawer, a counter per socket of its usable cores) and device
slices (a device per advertised group at each level, consuming the counters of every socket it covers), within the
API's per-slice limits; attributes under the driver's domain and ``resource.kubernetes.io/numaNode``; a
``NoSchedule`` taint on a group that is no longer whole, and on one the device-plugin mode holds or that overlaps it.

Must hold: the scheduler never hands out a group together with one inside it (the counters' arithmetic is the overlap
rule), and the same grouping gives the same slices byte for byte (the pool generation is the publisher's). The
layout and its reasons: docs/contributing/design/dra-slices.md."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import PolicyError
from agent.policy.grouping import Group, Grouping
from agent.policy.naming import is_dns1123_subdomain
from agent.topology.model import Topology

DRIVER = "topology.s390x.ibm.com"
API_VERSION = "resource.k8s.io/v1"

MAX_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (counters, taints)
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_CONSUMPTIONS_PER_DEVICE = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_ATTRIBUTES_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_STRING_VALUE = 64  # DeviceAttributeMaxValueLength
MAX_NAME = 253  # object names (DNS-1123 subdomain)
MAX_LABEL = 63  # device, counter set and counter names (DNS-1123 label)

TAINT_KEY = f"{DRIVER}/unhealthy"
IN_USE_TAINT_KEY = f"{DRIVER}/in-use"
TAINT_EFFECT = "NoSchedule"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"  # the standard attribute (k8s.io/api resource/v1)
CONTENT_ANNOTATION = f"{DRIVER}/content"  # sha256 of a slice's spec without the pool generation

JSON = dict[str, Any]
SocketKey = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class SliceSettings:
    node_name: str
    driver: str = DRIVER

    def validated(self) -> SliceSettings:
        if not self.node_name or len(self.node_name) > MAX_NAME or not is_dns1123_subdomain(self.node_name):
            raise PolicyError(f"node name {self.node_name!r} is not a DNS subdomain: DRA mode needs NODE_NAME")
        if len(self.driver) > 63 or not is_dns1123_subdomain(self.driver) or "." not in self.driver:
            raise PolicyError(f"DRA driver name {self.driver!r} must be a DNS subdomain with a dot, at most 63 "
                              "characters")
        return self


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """One ResourceSlice: its fixed name and its spec (``pool.generation`` left 0 for the publisher)."""

    name: str
    spec: JSON

    @property
    def content(self) -> str:
        """What the publisher compares: a hash of the spec without the pool generation."""
        return content_hash(self.spec)

    def with_generation(self, generation: int) -> JSON:
        spec: JSON = json.loads(json.dumps(self.spec))
        spec["pool"]["generation"] = generation
        return spec


@dataclass(frozen=True, slots=True)
class PoolPlan:
    driver: str
    node_name: str
    pool: str
    slices: tuple[SlicePlan, ...]
    counters: Mapping[str, Mapping[str, int]]  # counter set -> socket counter -> cores
    left_out: tuple[str, ...] = ()  # devices not published, with the reason

    @property
    def devices(self) -> list[JSON]:
        return [d for s in self.slices for d in s.spec.get("devices", [])]

    def content(self) -> str:
        return content_hash([{"name": s.name, "spec": s.spec} for s in self.slices])


def content_hash(value: object) -> str:
    """sha256 of ``value`` without any pool generation, as canonical JSON."""
    def strip(v: object) -> object:
        if isinstance(v, dict):
            return {k: (strip({kk: vv for kk, vv in x.items() if kk != "generation"}) if k == "pool"
                        and isinstance(x, dict) else strip(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    text = json.dumps(strip(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _label(text: str) -> str:
    if len(text) > MAX_LABEL:  # cannot happen with int ids; kept as a guard
        raise PolicyError(f"{text!r} is longer than {MAX_LABEL} characters")
    return text


def _socket_of(cpu_socket: dict[int, SocketKey], core: tuple[int, ...], group: Group) -> SocketKey:
    """The socket a core of ``group`` is in (the group's own key for a socket)."""
    return group.key if group.level == "socket" else cpu_socket.get(core[0], group.key)


def _socket_counter_name(key: SocketKey) -> str:
    drawer, book, socket = ((*tuple(key), None, None, None))[:3]
    parts = [f"book{book}" if book is not None else "nobook",
             f"socket{socket}" if socket is not None else "nosocket"]
    if drawer is None:
        parts.insert(0, "nodrawer")
    return _label("-".join(parts))


def _drawer_name(drawer: int | None) -> str:
    return f"drawer{drawer}" if drawer is not None else "nodrawer"


def _polarization(group: Group) -> str:
    if len(group.polarization) == 1:
        return group.polarization[0][0]
    return "mixed"


def _attributes(group: Group, topology: Topology) -> JSON:
    attrs: JSON = {"level": {"string": group.level}}
    for level, value in zip(("drawer", "book", "socket"), group.key, strict=False):
        if value is not None:
            attrs[level] = {"int": value}
    attrs["cores"] = {"int": len(group.cores)}
    attrs["cpus"] = {"int": len(group.cpus)}
    attrs["smtThreads"] = {"int": group.threads_per_core}
    attrs["memoryNode"] = {"int": group.memory_node}
    attrs[NUMA_NODE_ATTRIBUTE] = {"int": group.memory_node}
    attrs["polarization"] = {"string": _polarization(group)}
    machine_type = topology.machine.machine_type
    if machine_type:
        attrs["machineType"] = {"string": machine_type[:MAX_STRING_VALUE]}
    for name, value in attrs.items():
        text = value.get("string")
        if text is not None and len(text) > MAX_STRING_VALUE:  # guarded above; every value is short
            raise PolicyError(f"attribute {name} {text!r} is longer than {MAX_STRING_VALUE} characters")
    return attrs


def slice_name(node: str, suffix: str) -> str:
    """``<node>-topology-<suffix>``, cut with a hash so that it stays a valid name of at most 253 characters."""
    name = f"{node}-topology-{suffix}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[:MAX_NAME - len(suffix) - 22].rstrip('.-')}-{digest}-topology-{suffix}"


def build_pool(grouping: Grouping, topology: Topology, settings: SliceSettings,
               broken: Mapping[tuple[str, str], str] | None = None,
               in_use: Mapping[tuple[str, str], str] | None = None) -> PoolPlan:
    """The node's ResourceSlices for ``grouping`` (``broken``: devices no longer whole; ``in_use``: devices the
    device-plugin mode holds or that overlap one; both tainted)."""
    settings = settings.validated()
    broken = broken or {}
    in_use = in_use or {}
    cpu_socket: dict[int, SocketKey] = {c.cpu: c.socket_key for c in topology.cpus}

    # Each socket's usable cores: from every advertised group that covers it (they agree; max to be safe).
    consumption: dict[str, dict[SocketKey, int]] = {}  # device name -> socket -> cores it takes
    socket_cores: dict[SocketKey, int] = {}
    for g in grouping.groups:
        taken: dict[SocketKey, int] = {}
        for core in g.cores:
            sk = _socket_of(cpu_socket, core, g)
            taken[sk] = taken.get(sk, 0) + 1
        consumption[g.id] = taken
        for sk, n in taken.items():
            socket_cores[sk] = max(socket_cores.get(sk, 0), n)

    # Counter sets: per drawer, in topology order, at most 32 counters each, a book never split.
    def order(k: SocketKey) -> tuple[int, ...]:
        return tuple(-1 if v is None else v for v in k)

    by_drawer: dict[int | None, list[SocketKey]] = {}
    for sk in sorted(socket_cores, key=order):
        by_drawer.setdefault(sk[0], []).append(sk)
    set_of: dict[SocketKey, str] = {}
    counter_sets: list[tuple[str, dict[str, int]]] = []
    for drawer in sorted(by_drawer, key=lambda d: -1 if d is None else d):
        books: dict[tuple[int | None, ...], list[SocketKey]] = {}
        for sk in by_drawer[drawer]:
            books.setdefault(sk[:2], []).append(sk)
        chunks: list[list[SocketKey]] = [[]]
        for sockets in books.values():
            if len(sockets) > MAX_COUNTERS_PER_SET:
                raise PolicyError(f"book {sockets[0][:2]} has {len(sockets)} sockets, more than the "
                                  f"{MAX_COUNTERS_PER_SET} counters a counter set may hold")
            if len(chunks[-1]) + len(sockets) > MAX_COUNTERS_PER_SET:
                chunks.append([])
            chunks[-1].extend(sockets)
        for i, chunk in enumerate(chunks):
            name = _drawer_name(drawer) if i == 0 else f"{_drawer_name(drawer)}-{i}"
            counter_sets.append((name, {_socket_counter_name(sk): socket_cores[sk] for sk in chunk}))
            for sk in chunk:
                set_of[sk] = name

    pool_name = settings.node_name
    left_out: list[str] = []
    devices: list[JSON] = []
    for g in grouping.groups:
        uses: dict[str, dict[str, int]] = {}
        for sk, n in sorted(consumption[g.id].items(), key=lambda kv: order(kv[0])):
            uses.setdefault(set_of[sk], {})[_socket_counter_name(sk)] = n
        if len(uses) > MAX_CONSUMPTIONS_PER_DEVICE:
            left_out.append(f"{g.level} {g.id} not published: it spans {len(uses)} counter sets, more than the "
                            f"{MAX_CONSUMPTIONS_PER_DEVICE} a device may consume from")
            continue
        device: JSON = {
            "name": _label(g.id),
            "attributes": _attributes(g, topology),
            "capacity": {"cores": {"value": str(len(g.cores))}},
            "consumesCounters": [
                {"counterSet": name, "counters": {c: {"value": str(v)} for c, v in counters.items()}}
                for name, counters in uses.items()],
        }
        taints = []
        if (g.resource, g.id) in broken:
            taints.append({"key": TAINT_KEY, "value": "not-whole", "effect": TAINT_EFFECT})
        if (g.resource, g.id) in in_use:
            taints.append({"key": IN_USE_TAINT_KEY, "value": "device-plugin", "effect": TAINT_EFFECT})
        if taints:
            device["taints"] = taints
        devices.append(device)

    counter_chunks = [counter_sets[i:i + MAX_COUNTER_SETS_PER_SLICE]
                      for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)]
    device_chunks = [devices[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    count = len(counter_chunks) + len(device_chunks)

    def spec(body: JSON) -> JSON:
        return {"driver": settings.driver, "nodeName": settings.node_name,
                "pool": {"name": pool_name, "generation": 0, "resourceSliceCount": count}, **body}

    slices: list[SlicePlan] = []
    for i, sets in enumerate(counter_chunks):
        slices.append(SlicePlan(slice_name(settings.node_name, f"counters-{i}"), spec({"sharedCounters": [
            {"name": name, "counters": {c: {"value": str(v)} for c, v in counters.items()}}
            for name, counters in sets]})))
    for i, dchunk in enumerate(device_chunks):
        slices.append(SlicePlan(slice_name(settings.node_name, f"devices-{i}"), spec({"devices": dchunk})))
    return PoolPlan(driver=settings.driver, node_name=settings.node_name, pool=pool_name, slices=tuple(slices),
                    counters={name: dict(counters) for name, counters in counter_sets}, left_out=tuple(left_out))


def level_of_device(name: str) -> str | None:
    """The level of one of our device names (``drawer0-book1-socket0`` -> ``socket``), None when not ours."""
    last = name.rsplit("-", 1)[-1]
    for level in ("socket", "book", "drawer"):
        if last.startswith(level) and last[len(level):].isdigit():
            return level
    return None


def deviceclass(level: str, driver: str = DRIVER, extended_resource: str | None = None) -> JSON:
    """The DeviceClass ``<level>.<driver>`` (the chart ships these; discover shows them)."""
    spec: JSON = {"selectors": [{"cel": {"expression": (
        f'device.driver == "{driver}" && device.attributes["{driver}"].level == "{level}"')}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": f"{level}.{driver}"},
            "spec": spec}


def describe(plan: PoolPlan) -> str:
    """What DRA mode would publish, for people: the pool, counters, devices with sizes and taints."""
    lines = [f"DRA mode would publish (driver {plan.driver}, pool {plan.pool}, {len(plan.slices)} ResourceSlice(s)):"]
    for name, counters in plan.counters.items():
        lines.append(f"  counter set {name}: " + ", ".join(f"{c}={v}" for c, v in counters.items()))
    for d in plan.devices:
        attrs = d["attributes"]
        uses = "; ".join(f"{u['counterSet']}: " + ",".join(u["counters"]) for u in d["consumesCounters"])
        taint = "".join(f" TAINTED ({'not whole' if t['key'] == TAINT_KEY else 'in use by a device-plugin pod'})"
                        for t in d.get("taints", []))
        lines.append(f"  device {d['name']}: {attrs['level']['string']}, {attrs['cores']['int']} cores, "
                     f"{attrs['cpus']['int']} cpus, consumes {uses}{taint}")
    for why in plan.left_out:
        lines.append(f"  {why}")
    return "\n".join(lines) + "\n"


def pool_dict(plan: PoolPlan) -> JSON:
    """The slices as the API objects the publisher writes (generation 0: the publisher sets it)."""
    return {"driver": plan.driver, "pool": plan.pool, "leftOut": list(plan.left_out),
            "resourceSlices": [{"apiVersion": API_VERSION, "kind": "ResourceSlice",
                                "metadata": {"name": s.name}, "spec": s.spec} for s in plan.slices]}
