"""The ``topology-agent`` command line: flags -> settings -> wiring, nothing else.

:mod:`agent.cli.flags` is the flag and environment table, :mod:`agent.cli.settings` turns flags into settings, and
each command is a module of its own (``HELP``, ``add_flags``, ``run``) that imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NoReturn

from agent.cli import demo, discover, explain, seccomp_profile, serve, snapshot, uninstall
from agent.cli.flags import check_choices
from agent.errors import UserError, one_line
from agent.version import version_line

COMMANDS: dict[str, ModuleType] = {
    "discover": discover,
    "explain": explain,
    "snapshot": snapshot,
    "serve": serve,
    "seccomp-profile": seccomp_profile,
    "demo": demo,
    "uninstall": uninstall,
}
Command = Callable[[argparse.Namespace], int]


MAX_ECHO = 400  # characters of argparse's own error kept: one readable line


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag or value is one line and a hint, not the whole usage first."""

    def error(self, message: str) -> NoReturn:
        line = one_line(message)
        if len(line) > MAX_ECHO:  # argparse echoes every argument it refused: what was typed may be long
            line = f"{line[:MAX_ECHO]}... ({len(line) - MAX_ECHO} more characters)"
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """``--version``: the version and the commit (git runs only when asked for, from a checkout)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        sys.stdout.write(version_line() + "\n")
        parser.exit(0)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or, with ``only``, every command but only that one's flags (each
    command imports what its flags need: ``discover`` starts without the rest)."""
    parser = Parser(prog="topology-agent",
                    description="Makes IBM Z CPU topology (drawers, books, sockets) schedulable.")
    parser.add_argument("--version", action=VersionAction, help="print the version and the commit, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP)
        p.set_defaults(func=command.run)
        if only is None or only == name:
            command.add_flags(p)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC core's own INFO lines (e.g. "Got goaway" when kubelet restarts) would break JSON logs.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(only=_command_in(argv))
        args = parser.parse_args(argv)
        check_choices(parser, args)
        func: Command = args.func
        return func(args)
    except UserError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path given on the command line that the system refuses
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")


def _fail(message: str) -> int:
    from agent.observe.logs import shutdown_logging

    shutdown_logging()  # what was logged comes first, the reason to stop last
    print(f"topology-agent: error: {one_line(message)}", file=sys.stderr)
    return 2
