"""``discover`` parses its plain flags without argparse (agent/cli.py ``quick_discover_args``): the flags it knows
are discover's argparse flags, it makes the namespace argparse makes, and it leaves everything else to argparse
(errors and --help stay argparse's: one line, exit 2)."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent import cli
from agent.errors import UsageError
from agent.topology.embedded import load_embedded
from tests.conftest import REPO
from topology_devkit.sysfs_writer import write_sysfs_tree


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(cli.ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def argparse_args(argv: list[str]) -> argparse.Namespace | None:
    """argparse's namespace, after the environment twins' choice check; None where it refuses."""
    parser = cli.build_parser(only="discover")
    try:
        args = parser.parse_args(argv)
        cli.check_choices(parser, args)
    except (SystemExit, UsageError):
        return None
    return args


def discover_actions() -> list[argparse.Action]:
    parser = cli.build_parser(only="discover")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["discover"]._actions if a.dest != "help"]


def test_the_quick_flags_are_discovers_argparse_flags() -> None:
    with environment({}):
        actions = discover_actions()
        stores = {a.option_strings[0]: (a.dest, a.default, None if a.choices is None else tuple(a.choices))
                  for a in actions if not isinstance(a, argparse.BooleanOptionalAction)}
        switches = {a.option_strings[0]: a.dest for a in actions if isinstance(a, argparse.BooleanOptionalAction)}
        assert all(len(a.option_strings) == (2 if a.option_strings[0] in switches else 1) for a in actions)
        assert all(a.default is None for a in actions if a.option_strings[0] in switches)
    assert {flag: spec[:3] for flag, spec in cli.DISCOVER_FLAGS.items()} == stores
    assert switches == cli.DISCOVER_SWITCHES
    # A flag has an environment twin when argparse's default reads it.
    with environment({cli.env_name(flag): "twin" for flag in cli.DISCOVER_FLAGS}):
        twins = {a.option_strings[0]: a.default == "twin" for a in discover_actions() if a.option_strings[0] in stores}
    assert {flag: spec[3] for flag, spec in cli.DISCOVER_FLAGS.items()} == twins


CASES: list[tuple[list[str], dict[str, str]]] = [
    (["discover"], {}),
    (["discover", "--format", "json"], {}),
    (["discover", "--format=json", "--host-root", "/x", "--proc-root=/y"], {}),
    (["discover", "--levels", "book,socket", "--levels=drawer", "--min-group-cores", "0"], {}),
    (["discover", "--uniform-groups", "--no-allow-non-s390x", "--no-uniform-groups"], {}),
    (["discover", "--reserved-cpus=", "--exclude-polarization", "vertical:low", "--resource-prefix", "example.com"],
     {}),
    (["discover", "--levels=-weird", "--cri-socket="], {}),
    (["discover", "--mode", "dra", "--cpuset-enforcement", "auto", "--nri-socket", "/n", "--cri-socket", "/c"], {}),
    (["discover", "--topology-file", "embedded:z16-lpar", "--source", "lscpu"], {}),
    (["discover"], {"TOPOLOGY_AGENT_LEVELS": "book", "TOPOLOGY_AGENT_HOST_ROOT": "/h",
                    "TOPOLOGY_AGENT_CPUSET_ENFORCEMENT": "cri", "TOPOLOGY_AGENT_FORMAT": "json"}),
    (["discover", "--levels", "socket"], {"TOPOLOGY_AGENT_LEVELS": "book", "TOPOLOGY_AGENT_UNIFORM_GROUPS": "true"}),
]
# Left to argparse: abbreviations, help, errors, what argparse reads in its own ways.
REFUSED: list[tuple[list[str], dict[str, str]]] = [
    ([], {}), (["explain"], {}), (["--version"], {}), (["discover", "-h"], {}), (["discover", "--help"], {}),
    (["discover", "--form", "json"], {}), (["discover", "--format", "xml"], {}), (["discover", "--format"], {}),
    (["discover", "--levels", "--format", "json"], {}), (["discover", "--min-group-cores", "-1"], {}),
    (["discover", "--uniform-groups=yes"], {}), (["discover", "extra"], {}), (["discover", "--", "x"], {}),
    (["discover", "--no-format"], {}), (["discover", "--format json"], {}),
    (["discover"], {"TOPOLOGY_AGENT_SOURCE": "hwloc"}), (["discover"], {"TOPOLOGY_AGENT_MODE": "both"}),
]


@pytest.mark.parametrize(("argv", "env"), CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else str(x))
def test_the_quick_namespace_is_argparses(argv: list[str], env: dict[str, str]) -> None:
    with environment(env):
        quick = cli.quick_discover_args(argv)
        assert quick is not None
        assert vars(quick) == vars(argparse_args(argv))


@pytest.mark.parametrize(("argv", "env"), REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else str(x))
def test_anything_else_is_left_to_argparse(argv: list[str], env: dict[str, str]) -> None:
    with environment(env):
        assert cli.quick_discover_args(argv) is None


def test_random_command_lines_agree_with_argparse() -> None:
    """Whenever the quick parse takes a command line, argparse takes it too and makes the same namespace."""
    rng = random.Random(23)
    tokens = [*cli.DISCOVER_FLAGS, *cli.DISCOVER_SWITCHES, *(f"--no-{f[2:]}" for f in cli.DISCOVER_SWITCHES),
              "json", "table", "sysfs", "lscpu", "dra", "auto", "none", "book", "0", "-1", "", "-", "--", "-h",
              "--form", "--format=json", "--levels=", "--uniform-groups=1", "/tmp", "x=y"]
    twins = [cli.env_name(f) for f in cli.DISCOVER_FLAGS] + ["TOPOLOGY_AGENT_UNIFORM_GROUPS"]
    taken = 0
    for _ in range(1500):
        argv = ["discover", *(rng.choice(tokens) for _ in range(rng.randrange(7)))]
        env = {rng.choice(twins): rng.choice(["json", "nri", "book", "x", ""]) for _ in range(rng.randrange(3))}
        with environment(env):
            quick = cli.quick_discover_args(argv)
            if quick is not None:
                taken += 1
                want = argparse_args(argv)
                assert want is not None, (argv, env)
                assert vars(quick) == vars(want), (argv, env)
    assert taken > 100  # the check ran on many command lines the quick parse took


def test_a_bad_flag_is_still_argparses_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["discover", "--format", "xml"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --format: invalid choice: 'xml'" in err and "--help" in err


def test_the_command_as_a_process_prints_what_main_returns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """python -m agent (the console script's main, which ends with os._exit and runs without the collector)
    prints what main() prints in-process, and exits 0; an error is one line, exit 2."""
    write_sysfs_tree(load_embedded("z16-400"), tmp_path)
    argv = ["discover", "--format", "json", "--host-root", str(tmp_path), "--levels", "book,socket"]
    with environment({}):
        assert cli.main(argv) == 0
        want = capsys.readouterr().out
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([sys.executable, "-m", "agent", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, want, "")
    bad = subprocess.run([sys.executable, "-m", "agent", "discover", "--host-root", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
