"""The pure helpers import without grpc: the s390x smoke lane has no grpcio and runs the tests that use them.

Each check runs in a fresh interpreter in which importing grpc (or grpc_tools) fails, as it does there.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.env import REPO

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpc", "grpc_tools"):
            raise ImportError("No module named %r (blocked: the s390x lane has no grpcio)" % name)
        return None
sys.meta_path.insert(0, Block())
sys.path[:0] = [REPO, DEVKIT]
"""


def without_grpc(code: str) -> subprocess.CompletedProcess[str]:
    prelude = BLOCK.replace("REPO", repr(str(REPO))).replace("DEVKIT", repr(str(REPO / "devkit")))
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)


def test_the_blocker_blocks() -> None:
    result = without_grpc("import grpc")
    assert result.returncode != 0 and "blocked: the s390x lane has no grpcio" in result.stderr


@pytest.mark.parametrize("module", [
    "topology_devkit.kubelet_emulator.names",
    "topology_devkit.kubelet_emulator.constants",
    "topology_devkit.synthetic",
    "topology_devkit.sysfs_writer",
    "agent.policy.grouping",
    "agent.policy.allocation",
    "agent.topology.sysfs",
    "topology_devkit.testing.wait",
    "topology_devkit.testing.apiserver",
    "tests.support.env",  # what most grpc-free tests import: the root conftest.py imports it too
    "tests.unit.policy.test_grouping",  # imports the emulator's names: collected on the s390x lane
])
def test_imports_without_grpc(module: str) -> None:
    result = without_grpc(f"import importlib; importlib.import_module({module!r}); "
                          "assert 'grpc' not in sys.modules, 'grpc was imported'")
    assert result.returncode == 0, result.stderr


def test_the_emulator_package_still_exports_everything_lazily() -> None:
    result = without_grpc(
        "from topology_devkit.kubelet_emulator import is_extended_resource_name, HEALTHY\n"
        "assert is_extended_resource_name('topology/book') and HEALTHY == 'Healthy'\n"
        "try:\n"
        "    from topology_devkit.kubelet_emulator import KubeletEmulator\n"
        "except ImportError as exc:\n"
        "    print('needs grpc:', exc)\n")
    assert result.returncode == 0, result.stderr
    assert "needs grpc:" in result.stdout and "grpc" in result.stdout
    import topology_devkit.kubelet_emulator as package

    assert sorted(package.__all__) == sorted(package._WHERE)
    pytest.importorskip("grpc", reason="the emulator itself needs grpc (absent on the s390x lane)")
    for name in package.__all__:
        assert getattr(package, name) is not None
