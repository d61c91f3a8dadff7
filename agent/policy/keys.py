"""The keys every layer shares: a device (resource, id), a container's identity as kubelet names it, and who holds
a device. Plain values, no logic beyond naming them; everything that speaks of devices or holders imports them
from here."""

from __future__ import annotations

from dataclasses import dataclass

DeviceKey = tuple[str, str]  # (resource, device id)
Identity = tuple[str, str, str]  # kubelet's namespace, pod, container


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """Who holds a device: a pod's container, or our own Allocate not yet listed by kubelet; ``claim``
    (``namespace/name``) when it is held through a DRA claim (a prepared claim no container is listed with yet has
    no namespace, pod or container)."""

    namespace: str
    pod: str
    container: str
    claim: str = ""

    def __str__(self) -> str:
        if not self.namespace:
            return self.pod if self.claim else f"pending allocation ({self.pod})"
        through = f" (claim {self.claim})" if self.claim else ""
        return f"{self.namespace}/{self.pod}/{self.container}{through}"


def claim_holder(claim: str) -> Holder:
    """A prepared DRA claim (``namespace/name``) as a holder of its devices."""
    return Holder("", f"claim {claim}", "", claim)
