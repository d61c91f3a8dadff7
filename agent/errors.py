"""Errors that stop the agent from starting; the command line prints them as one line."""


class StartupError(RuntimeError):
    """Something the agent needs is taken or unusable (a socket, a port)."""
