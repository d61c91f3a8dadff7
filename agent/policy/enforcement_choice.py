"""Which cpuset enforcement is in force for ``--cpuset-enforcement``. Pure, and light on purpose:
``discover`` and ``explain`` say it, and importing it must not import the planners."""

from __future__ import annotations


def enforcement_mode(requested: str, nri_answers: bool, cri_socket_exists: bool) -> tuple[str, str]:
    """The enforcement in force for ``--cpuset-enforcement`` (none, cri, nri, auto) and why.

    auto: NRI when its socket answers (the cpuset is right at creation), else CRI when a CRI socket
    exists (pinned shortly after the start), else none."""
    if requested != "auto":
        return requested, f"--cpuset-enforcement {requested}"
    if nri_answers:
        return "nri", "auto: the NRI socket answers"
    if cri_socket_exists:
        return "cri", "auto: no NRI socket answers, a CRI socket exists"
    return "none", "auto: neither an NRI socket answers nor a CRI socket exists"
