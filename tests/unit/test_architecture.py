"""The shape of the product package: imports run one way (shell -> core), no cycles, and the
DaemonSet's package ships the product alone."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import REPO

PACKAGE = REPO / "agent"
# Lower layers never import higher ones; the adapters of one layer do not import each other.
LAYERS: dict[str, int] = {
    "agent": 0, "agent.errors": 0, "agent.version": 0,  # version and exceptions: leaves everyone may use
    "agent.topology": 1, "agent.policy": 2,  # the core: pure model, readers, rules
    "agent.devices": 3,  # the node's device table
    "agent.plugin": 4, "agent.node": 4, "agent.observe": 4,  # adapters: kubelet, Kubernetes API, metrics/HTTP/logs
    "agent.cri": 4,  # adapter: the container runtime (CRI)
    "agent.nri": 4,  # adapter: the container runtime (NRI plugin)
    "agent.dra": 4,  # adapter: DRA (ResourceSlices, ResourceClaims, the kubelet DRA plugin, CDI)
    "agent.enforce": 5,  # the cpuset enforcement engines: the CRI loop, the NRI hooks, auto, evictions
    "agent.app": 6,  # wiring and the running agent
    "agent.cli": 7, "agent.__main__": 8,
}
CORE = ("agent.topology", "agent.policy")
DOCSTRING_MAX = 15  # lines: what the module does and what must hold; design essays go to docs/contributing/design
ISSUE_NUMBER = re.compile(r"issue[ -]?#?[0-9]+", re.IGNORECASE)  # the tracker's history belongs in git, not the code


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(REPO).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if not name.startswith("agent._proto"):
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every module of the package that ``name`` imports, at any depth of its code (lazy ones too)."""

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            module = node.module
            if node.level:
                base = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{module}"
            if module.split(".")[0] != "agent" or module.startswith("agent._proto"):
                continue
            for alias in node.names:
                target = resolve(f"{module}.{alias.name}") if f"{module}.{alias.name}" in known else resolve(module)
                if target is not None and target != name:
                    yield target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "agent" and not alias.name.startswith("agent._proto"):
                    target = resolve(alias.name)
                    if target is not None and target != name:
                        yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(name, path, known)) for name, path in known.items()}


def layer_of(module: str) -> tuple[str, int]:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return best, LAYERS[best]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == []


def test_imports_run_from_the_shell_to_the_core_and_never_back() -> None:
    wrong = []
    for module, targets in graph().items():
        package, level = layer_of(module)
        for target in targets:
            target_package, target_level = layer_of(target)
            if target_package == package or target_level == 0:
                continue
            if target_level >= level:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_core_imports_nothing_outside_the_core() -> None:
    for module, targets in graph().items():
        if module.startswith(CORE):
            outside = {t for t in targets if not t.startswith(CORE) and t not in ("agent", "agent.errors")}
            assert not outside, f"{module} imports {outside}"


def docstring_lines(source: str) -> int:
    """The lines a module's docstring spans, its quotes included (0 without one)."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def shared_bare_names(names: list[str]) -> dict[str, list[str]]:
    """Bare name -> the modules and packages (the root aside) that have it, where more than one does."""
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        if "." in name:
            found.setdefault(name.rpartition(".")[2], []).append(name)
    return {bare: where for bare, where in found.items() if len(where) > 1}


def test_module_docstrings_say_what_holds_in_a_few_lines() -> None:
    """A module's docstring says what it does and what must always hold; the design and its history of reasons live
    in docs/contributing/design/, one page per topic."""
    long = {str(path.relative_to(REPO)): n for path in modules().values()
            if (n := docstring_lines(path.read_text(encoding="utf-8"))) > DOCSTRING_MAX}
    assert long == {}


def test_the_product_names_no_tracker_issue() -> None:
    """Code states rules and reasons; which issue brought them is git's to tell."""
    found = [f"{path.relative_to(REPO)}:{n}" for path in modules().values()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if ISSUE_NUMBER.search(line)]
    assert found == []


def test_no_two_modules_share_a_bare_name() -> None:
    """Each module's name says what it computes, so no two (generated code aside) have the same one."""
    assert shared_bare_names(list(modules())) == {}


TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:tests|bench)(?:\.\w+)*\.test_\w+", re.MULTILINE)


def test_no_test_module_borrows_from_another() -> None:
    """What two test modules share lives in tests/support/ (or the bench's lib/): a test file is run, never imported."""
    found = [str(path.relative_to(REPO)) for root in (REPO / "tests", REPO / "bench") for path in root.rglob("*.py")
             if TEST_MODULE_IMPORT.search(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_checks_can_fail() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("agent.plugin.servicer") == ("agent.plugin", 4)
    assert layer_of("agent.cri.client") == ("agent.cri", 4)
    assert layer_of("agent.policy.ledger")[1] < layer_of("agent.devices.table")[1]
    assert layer_of("agent.dra.driver")[1] < layer_of("agent.enforce.nri_hooks")[1] < layer_of("agent.app.build")[1]
    assert docstring_lines('"""One.\n\nTwo.\n"""\nx = 1\n') == 4 and docstring_lines("x = 1\n") == 0
    assert ISSUE_NUMBER.search("# --- " + "Issue" + " #30 ---") and not ISSUE_NUMBER.search("an issue of timing")
    assert shared_bare_names(["agent", "agent.dra", "agent.policy.dra", "agent.app.agent"]) == {
        "dra": ["agent.dra", "agent.policy.dra"]}
    assert TEST_MODULE_IMPORT.search("x = 1\nfrom tests.unit.dra.test_kubelet_plugin import claim\n")
    assert not TEST_MODULE_IMPORT.search("from tests.support.dra_claims import claim\n")


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300, check=False)
    if build.returncode != 0:
        pytest.fail(f"pip wheel failed: {build.stderr[-2000:]}")
    (wheel,) = out.glob("s390x_topology_agent-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_product_wheel_ships_no_emulator_generator_or_demo(product_wheel: zipfile.ZipFile) -> None:
    names = product_wheel.namelist()
    packages = {n.split("/")[0] for n in names if not n.endswith(".dist-info/") and ".dist-info" not in n}
    assert packages == {"agent"}
    # agent/cli/demo.py is the command's stub: it finds the development kit's demo through an entry point.
    shipped = [n for n in names if n != "agent/cli/demo.py"]
    for unwanted in ("kubelet_emulator", "synthetic", "sysfs_writer", "shape.py", "demo", "topology_devkit"):
        assert not [n for n in shipped if unwanted in n], unwanted
    assert "agent/data/seccomp/vllm-numa-s390x.json" in names and "agent/data/z16-lpar.json" in names


def test_every_cited_reference_note_exists() -> None:
    """Docstrings cite the team's reference notes (../shared/docs/<name>.md): the file must be there."""
    shared = REPO.parent / "shared" / "docs"
    if not shared.is_dir():
        pytest.skip(f"the reference notes are not beside the repository ({shared})")
    cited: dict[str, list[str]] = {}
    for folder in ("agent", "devkit", "tests", "bench", "tools"):
        for path in (REPO / folder).rglob("*.py"):
            for name in re.findall(r"(?<![\w/.])(?:\.\./shared/)?docs/([\w.-]+\.md)", path.read_text(encoding="utf-8")):
                cited.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert cited, "no citation found: the pattern is wrong"
    assert {name: where for name, where in cited.items() if not (shared / name).is_file()} == {}
    bare = [str(p.relative_to(REPO)) for folder in ("agent", "devkit") for p in (REPO / folder).rglob("*.py")
            if re.search(r"(?<![\w/.])docs/[\w-]+\.md", p.read_text(encoding="utf-8").replace("../shared/docs/", ""))]
    assert bare == [], "cite the notes by their path from the repository root: it has no docs/ folder"
