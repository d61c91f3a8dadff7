"""Extended resource names, validated the way kubelet validates them, and device ids."""

from __future__ import annotations

import re

from agent.errors import PolicyError

MAX_DEVICE_ID = 63

# kubelet's patterns (tests/unit/policy/test_grouping.py holds them to the kubelet emulator's copy).
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_dns1123_subdomain(text: str) -> bool:
    return _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def is_qualified_name_part(text: str) -> bool:
    return _QUALIFIED_NAME_PART.fullmatch(text) is not None


def resource_name_error(name: str) -> str | None:
    """Why kubelet would reject ``name`` as an extended resource name, or None when valid.

    kubelet's rule (``v1helper.IsExtendedResourceName``): the name contains ``/``, does not
    contain ``kubernetes.io/``, does not start with ``requests.``, and ``requests.<name>`` is
    a qualified name: a lowercase DNS-1123 subdomain prefix (<= 253 characters), one ``/``,
    and a name part of at most 63 characters of ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``.
    """
    if "/" not in name:
        return f"resource name {name!r} has no domain prefix (expected prefix/name, e.g. topology/book)"
    if "kubernetes.io/" in name:
        return f"resource name {name!r} uses the reserved kubernetes.io domain"
    if name.startswith("requests."):
        return f"resource name {name!r} starts with the quota prefix 'requests.'"
    prefix, _, part = f"requests.{name}".partition("/")
    if "/" in part:
        return f"resource name {name!r} has more than one '/'"
    if len(prefix) > 253 or not is_dns1123_subdomain(prefix):
        return f"resource name {name!r}: prefix must be a lowercase DNS-1123 subdomain"
    if not part or len(part) > 63 or not is_qualified_name_part(part):
        return f"resource name {name!r}: name part must be 1-63 alphanumerics, '-', '_' or '.'"
    return None


def resource_name(prefix: str, level: str) -> str:
    """``<prefix>/<level>``; PolicyError (a ValueError) when kubelet would reject it."""
    name = f"{prefix}/{level}"
    error = resource_name_error(name)
    if error is not None:
        raise PolicyError(f"invalid --resource-prefix {prefix!r}: {error}")
    return name


def device_id(key: dict[str, int | None]) -> str:
    """A readable device id such as ``drawer4-book1-socket2`` (levels with no id left out)."""
    parts = [f"{level}{value}" for level, value in key.items() if value is not None]
    text = "-".join(parts) or "all"
    if len(text) > MAX_DEVICE_ID:  # cannot happen with int ids, kept as a guard
        raise ValueError(f"device id {text!r} is longer than {MAX_DEVICE_ID} characters")
    return text
