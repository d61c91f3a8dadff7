"""Errors raised by the topology readers."""


class TopologyReadError(Exception):
    """Input that cannot be read as topology: the message names the file and the problem."""
