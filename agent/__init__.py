"""s390x-topology-agent: makes IBM Z CPU topology (drawers, books, sockets) schedulable in Kubernetes."""

# The one place the version is written (PEP 440); the chart and the image tag say it in SemVer form
# (agent/version.py, docs/admin/releases.md).
__version__ = "0.2.0.dev0"
