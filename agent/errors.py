"""Errors that stop the agent from starting; the command line prints them as one line."""


class StartupError(RuntimeError):
    """Something the agent needs is taken or unusable (a socket, a port)."""


class UsageError(Exception):
    """A flag value or input that cannot be used; printed as one line, exit status 2."""
