"""The soak's seeded schedule: pod churn and faults, the same for the same seed.

Pods and faults come from two generators seeded from the seed (``random.Random(f"{seed}-pods")`` and
``...-faults``), so a shorter soak with the same seed runs the beginning of a longer one. Pure: no clock, no I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

POD_KINDS = ("book", "socket", "multi", "init", "plain", "dra", "mid-start")
POD_WEIGHTS = (5, 3, 2, 2, 2, 2, 2)
FAULT_KINDS = ("agent-kill", "kubelet-kill", "containerd-kill", "kubelet-restart-admission",
               "containerd-restart-nri", "cpu-offline", "helm-upgrade", "mode-switch", "enforcement-switch")
# (cpusetEnforcement, sharedPool): the enforcement switch moves between these
ENFORCEMENTS = (("cri", False), ("nri", False), ("cri", True), ("nri", True))


@dataclass(frozen=True)
class PodStep:
    t: float  # seconds after the start
    kind: str
    name: str
    lifetime: float  # seconds it runs before the soak deletes it (mid-start: seconds after creation)


@dataclass(frozen=True)
class FaultStep:
    t: float
    kind: str
    mode: str = ""  # mode-switch: the mode switched to
    enforcement: str = ""  # enforcement-switch: the enforcement switched to
    shared_pool: bool = False
    cpu: int = -1  # cpu-offline: the CPU of the fake topology
    seconds: float = 0.0  # cpu-offline: how long it stays offline

    def label(self) -> str:
        extra = {"mode-switch": f" to {self.mode}",
                 "enforcement-switch": f" to {self.enforcement}{' + shared pool' if self.shared_pool else ''}",
                 "cpu-offline": f" cpu {self.cpu} for {self.seconds:.0f} s"}.get(self.kind, "")
        return f"{self.kind}{extra}"


@dataclass(frozen=True)
class Plan:
    seed: int
    seconds: float
    pods: tuple[PodStep, ...]
    faults: tuple[FaultStep, ...]


def make_plan(seed: int, seconds: float, cpus: int = 2, mode: str = "deviceplugin",
              enforcement: tuple[str, bool] = ("cri", False)) -> Plan:
    """The schedule for ``seconds`` of soak on a node of ``cpus`` one-CPU books starting in ``mode``."""
    rng = random.Random(f"{seed}-pods")
    pods: list[PodStep] = []
    t = 2.0
    n = 0
    while t < seconds:
        kind = rng.choices(POD_KINDS, POD_WEIGHTS)[0]
        lifetime = rng.uniform(0.2, 2.0) if kind == "mid-start" else rng.uniform(4.0, 20.0)
        n += 1
        pods.append(PodStep(round(t, 2), kind, f"soak-{seed}-{n:04d}-{kind}", round(lifetime, 2)))
        t += rng.uniform(1.5, 4.5)
    frng = random.Random(f"{seed}-faults")
    faults: list[FaultStep] = []
    t = frng.uniform(10.0, 25.0)
    while t < seconds:
        kind = frng.choice(FAULT_KINDS)
        step = FaultStep(round(t, 2), kind)
        if kind == "mode-switch":
            mode = "dra" if mode == "deviceplugin" else "deviceplugin"
            step = FaultStep(step.t, kind, mode=mode)
        elif kind == "enforcement-switch":
            enforcement = frng.choice([e for e in ENFORCEMENTS if e != enforcement])
            step = FaultStep(step.t, kind, enforcement=enforcement[0], shared_pool=enforcement[1])
        elif kind == "cpu-offline":
            step = FaultStep(step.t, kind, cpu=frng.randrange(cpus), seconds=round(frng.uniform(10.0, 30.0), 1))
        faults.append(step)
        t += frng.uniform(20.0, 45.0)
    return Plan(seed, seconds, tuple(pods), tuple(faults))
