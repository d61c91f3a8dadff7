"""The docs a reader finds: every flag, chart value and node label is documented, and every relative link resolves.

Metrics are held to the docs both ways in tests/deploy/chart/test_monitoring.py, the environment table and serve's
flag table with their defaults in tests/docs/test_readme_contract.py, the node labels' table in
tests/docs/test_readme_admin.py.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from agent.cli import build_parser
from agent.cli.flags import env_name
from agent.node.labels import KEY_PREFIX, LABEL_KEYS
from tests.support.chart import schema_leaves
from tests.support.env import REPO

DOCS = REPO / "docs"
CONFIGURATION = DOCS / "admin" / "configuration.md"
CHART = REPO / "deploy" / "helm" / "s390x-topology-agent"


def markdown_files() -> list[Path]:
    """README.md, docs/**, bench/*.md and deploy/**.md: the files whose relative links must resolve."""
    return sorted({REPO / "README.md", *DOCS.rglob("*.md"), *(REPO / "bench").glob("*.md"),
                   *(REPO / "deploy").rglob("*.md")})


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6} (.+)", line)
        if match and not fenced:
            base = slug(match.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def links(path: Path) -> list[str]:
    """The targets of the Markdown links outside code blocks and code spans."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "``", text)
    return LINK.findall(text)


def test_the_link_checker_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A title, with `code`\n\n## Switching modes\n\n[x](#a-title-with-code) [y](other.md#nope)\n"
                    "`[not](a-link.md)`\n```\n[nor](this.md)\n```\n")
    assert anchors(page) == {"a-title-with-code", "switching-modes"}
    assert links(page) == ["#a-title-with-code", "other.md#nope"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.is_dir() or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{path.relative_to(REPO)}: {broken}"


def test_every_flag_of_every_command_is_documented() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    documented = {span.split(" ")[0].split("=")[0] for span in code_spans(text)}
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = {}
    for name, sub in commands.choices.items():
        assert f"| `{name}` |" in text, name  # the commands' table
        flags = {o for action in sub._actions for o in action.option_strings} - {"-h", "--help"}
        if flags - documented:
            missing[name] = sorted(flags - documented)
    assert missing == {}


def test_help_shows_the_environment_name_of_every_flag_but_the_one_shot_commands_own() -> None:
    """configuration.md: --help prints every flag's environment name, but for the flags of its last table (none)."""
    text = CONFIGURATION.read_text(encoding="utf-8")
    section = text[text.index("## The other commands' flags"):]
    assert "Their own, which have no environment twin:" in section
    own = {(row[0], flag) for row in (line.split(" | ") for line in section.splitlines() if line.startswith("| `"))
           for flag in code_spans(row[1])}
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    without: set[tuple[str, str]] = set()
    wrong: list[tuple[str, list[str], str]] = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            flags = [o for o in action.option_strings if o not in ("-h", "--help")]
            if not flags:
                continue
            env = re.search(r"\[env (\w+)", action.help or "")
            if env is None:
                without.update((f"| `{name}`", flag) for flag in flags)
            elif env.group(1) != env_name(flags[0]):
                wrong.append((name, flags, env.group(1)))
    assert wrong == []
    assert without == own


def values_table() -> set[str]:
    text = CONFIGURATION.read_text(encoding="utf-8")
    section = text[text.index("## Chart values"):text.index("\n## ", text.index("## Chart values") + 1)]
    return {name for line in section.splitlines() if line.startswith("| `")
            for name in code_spans(line.split(" | ")[0])}


def test_every_chart_value_is_documented() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = set(schema_leaves(schema)) - {"global"}  # Helm's own
    documented = values_table()
    assert values - documented == set(), "chart values without a row in docs/admin/configuration.md"
    assert documented - values == set(), "rows in docs/admin/configuration.md that are no chart value"


def test_every_node_label_is_documented() -> None:
    text = (DOCS / "admin" / "node-labels.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in code_spans(row.split(" | ")[0])}
    assert {key.removeprefix(KEY_PREFIX) for key in LABEL_KEYS} <= documented
    assert "topology.s390x.ibm.com/topology" in text  # the annotation beside them
