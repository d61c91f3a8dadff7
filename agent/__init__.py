"""s390x-topology-agent: makes IBM Z CPU topology (drawers, books, sockets) schedulable in Kubernetes."""

__version__ = "0.1.0"
