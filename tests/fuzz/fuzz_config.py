"""Door: what an admin types. Every command's flags with any value, their environment twins (``TOPOLOGY_AGENT_*``)
with any value, and the chart's values against values.schema.json. Right answer: what parses runs (discover,
explain and snapshot on a bundled snapshot; serve's flags become its configuration); refusal: exit 2 with one line
on stderr (the CLI), a UserError (serve's configuration), a schema error or the chart's own ``fail`` (helm); and a
value the chart renders is one the agent then accepts from its environment. Never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from agent.cli import build_parser, main
from agent.cli.flags import check_choices, env_name
from agent.cli.serve import agent_config
from agent.errors import UserError
from tests.fuzz.common import SKIPPED, door, one_line
from tests.fuzz.mutate import json_values
from tests.support.chart import CHART, FLOOR, VAP_API, find_helm, schema_leaves

OUT = tempfile.mkdtemp(prefix="fuzz-config-")
VALUE_FLAGS = ["--levels", "--resource-prefix", "--reserved-cpus", "--exclude-polarization", "--min-group-cores",
               "--omp-threads-per-core", "--reserve-cores-per-group", "--source", "--cpuset-enforcement", "--mode",
               "--rescan-interval", "--pod-resources-interval", "--metrics-port", "--cpuset-interval",
               "--dra-interval", "--stranded-policy", "--log-level", "--log-format", "--metrics-address",
               "--format", "--arch"]
BOOL_FLAGS = ["--uniform-groups", "--allow-non-s390x", "--openmp-env", "--node-labels", "--shared-pool",
              "--allocations-pod-names"]
odd_values = st.sampled_from(["", " ", "0", "-1", "1", "2", "3", "auto", "none", "book", "book,socket", "socket,book",
                              "drawer,book,socket,book", "0-3", "3-0", "1e9", "nan", "inf", "0x10", "65536", "99999",
                              "true", "yes", "maybe", "vertical:low", "horizontal,x", "::", "0.0.0.0", "256.1.1.1",
                              "topology", "UPPER/case", "a/b/c", "x" * 300, "\u00e9", "0.001", "1000000"])
values = odd_values | st.text(max_size=12)


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    env = {k: v for k, v in env.items() if "\x00" not in v}  # no environment can hold a NUL
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    command = draw(st.sampled_from(["discover", "explain", "snapshot", "seccomp-profile"]))
    argv = [command]
    if command != "seccomp-profile":
        argv += ["--topology-file", draw(st.sampled_from(["embedded:z16-lpar", "embedded:z14-lpar",
                                                           "embedded:nope", "/nonexistent/x.json", ""]))]
    for flag in draw(st.lists(st.sampled_from(VALUE_FLAGS + BOOL_FLAGS), max_size=4)):
        argv += [flag] if flag in BOOL_FLAGS else [flag, draw(values)]
    if command == "snapshot":
        argv += ["-o", f"{OUT}/snapshot.json"]
    if command == "seccomp-profile" and draw(st.booleans()):
        argv += ["--install", draw(st.sampled_from([OUT, f"{OUT}/missing/dir", "/proc/nope"]))]
    env = {env_name(f): draw(values) for f in draw(st.lists(st.sampled_from(VALUE_FLAGS + BOOL_FLAGS), max_size=3))}
    return argv, env


def run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    out, err = io.TextIOWrapper(io.BytesIO()), io.StringIO()  # some commands write bytes to stdout's buffer
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exit
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@door("cli-flags", "config", command_lines())
def cli_flags(line: tuple[list[str], dict[str, str]]) -> None:
    argv, env = line
    code, err = run_cli(argv, env)
    assert "Traceback" not in err, err[-2000:]
    assert code in (0, 2), (code, err[-500:])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"exit 2 with {len(lines)} lines: {err[:600]!r}"
        assert len(lines[0]) <= 1000, lines[0][:300]


@door("serve-settings", "config", st.lists(st.tuples(st.sampled_from(VALUE_FLAGS[:-2] + BOOL_FLAGS), values),
                                           max_size=5), st.booleans())
def serve_settings(flags: list[tuple[str, str]], as_env: bool) -> None:
    """serve's flags and environment become its configuration, or a UserError; nothing else is raised."""
    argv, env = ["serve"], {}
    for flag, value in flags:
        if as_env:
            env[env_name(flag)] = "true" if flag in BOOL_FLAGS and value == "" else value
        else:
            argv += [flag] if flag in BOOL_FLAGS else [flag, value]
    with environment(env), contextlib.redirect_stderr(io.StringIO()):
        parser = build_parser(only="serve")
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2
            return
        try:
            check_choices(parser, args)
            config = agent_config(args)
            config.grouping.validated()
            config.allocation.validated()
        except UserError as exc:
            one_line(exc)


# --- the chart ------------------------------------------------------------------------------------------------

LEAVES = [leaf for leaf in schema_leaves(json.loads((CHART / "values.schema.json").read_text()))
          if not leaf.startswith(("global", "fakeTopology.snapshots"))]
HELM = find_helm()
FAIL_MARKS = ("values don't meet the specifications of the schema", "execution error at")
CRASH_MARKS = ("nil pointer", "runtime error", "panic", "error calling", "wrong type for value")


def agent_accepts(env: dict[str, str]) -> None:
    """The agent's environment as the chart rendered it: serve's configuration must build."""
    ours = {k: v for k, v in env.items() if k.startswith("TOPOLOGY_AGENT_")}
    with environment(ours), contextlib.redirect_stderr(io.StringIO()):
        parser = build_parser(only="serve")
        args = parser.parse_args(["serve"])
        check_choices(parser, args)
        config = agent_config(args)
        config.grouping.validated()
        config.allocation.validated()


def chart_values(sets: list[tuple[str, Any]]) -> None:
    assert HELM is not None
    args = [a for leaf, value in sets for a in ("--set-json", f"{leaf}={json.dumps(value)}")]
    done = subprocess.run([HELM, "template", "t", str(CHART), "-n", "kube-system", "--kube-version", FLOOR,
                           "--api-versions", VAP_API, *args], capture_output=True,
                          text=True, timeout=60, check=False)
    if done.returncode:
        assert not any(m in done.stderr for m in CRASH_MARKS), done.stderr[:800]
        assert any(m in done.stderr for m in FAIL_MARKS), done.stderr[:800]
        return
    import yaml

    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (agent,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    try:
        agent_accepts({e["name"]: str(e.get("value", "")) for e in agent.get("env", []) if "value" in e})
    except UserError as exc:
        raise AssertionError(f"the chart rendered {sets} but the agent refuses it: {exc}") from None


if HELM is not None:
    door("chart-values", "config", st.lists(st.tuples(st.sampled_from(LEAVES), json_values | odd_values),
                                            min_size=1, max_size=3))(chart_values)
else:
    SKIPPED["chart-values"] = "no helm: tools/get-helm.sh fetches it, or set HELM"
