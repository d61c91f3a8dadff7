"""Extended-resource name validation, as kubelet's `v1helper.IsExtendedResourceName` does it.

See ../shared/docs/kubelet-device-plugin.md §2.3.
"""

from __future__ import annotations

import re

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME_MAX = 63

RESOURCE_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"
RESOURCE_REQUESTS_PREFIX = "requests."


def is_dns1123_subdomain(value: str) -> bool:
    """`validation.IsDNS1123Subdomain`: lowercase RFC 1123 subdomain, at most 253 characters."""
    return len(value) <= _DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN_RE.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """`validation.IsQualifiedName`: ``[prefix/]name`` with a DNS-1123 subdomain prefix and a <= 63 char name."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns1123_subdomain(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= _QUALIFIED_NAME_MAX and _QUALIFIED_NAME_RE.fullmatch(name) is not None


def is_native_resource(name: str) -> bool:
    """`IsNativeResource`: no ``/`` at all, or anything under a ``kubernetes.io/`` prefix."""
    return "/" not in name or RESOURCE_DEFAULT_NAMESPACE_PREFIX in name


def is_extended_resource_name(name: str) -> bool:
    """True when kubelet accepts `name` as a device-plugin (extended) resource name.

    Rules: not native (must contain ``/`` and not ``kubernetes.io/``), must not start with
    ``requests.``, and ``"requests." + name`` must be a qualified name.
    """
    if is_native_resource(name) or name.startswith(RESOURCE_REQUESTS_PREFIX):
        return False
    return is_qualified_name(RESOURCE_REQUESTS_PREFIX + name)
