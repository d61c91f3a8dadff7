"""Generate the Python gRPC/protobuf code for the vendored kubelet, CRI and NRI APIs.

The ``.proto`` files live in this directory (``proto/``); the generated modules land inside the
``agent`` package under ``agent/_proto/`` by mapping the virtual include path
``agent/_proto`` onto this directory (``-Iagent/_proto=proto``). That makes the generated
``*_pb2_grpc.py`` import its messages as ``from agent._proto.deviceplugin.v1beta1 import api_pb2``
without editing generated files.

NRI's ``api.proto`` (``nri/v1alpha1/``, containerd/nri v0.12.3 as vendored by containerd v2.4.2, copied
byte for byte) is spoken over ttrpc, not gRPC: only its messages are generated (``agent/nri`` is
the ttrpc side). ttrpc's own envelope (``ttrpc/request.proto``, containerd/ttrpc, and the
``google/rpc/status.proto`` it imports, from googleapis: ``proto/ttrpc/README.md``) is generated the same way,
messages only.

Usage::

    python proto/generate.py            # regenerate in place (repo root)
    python proto/generate.py OUT_ROOT   # write OUT_ROOT/agent/_proto/...

The hand-written ``__init__.py`` files under ``agent/_proto`` are not produced here.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
VIRTUAL_ROOT = "agent/_proto"

# Proto files relative to PROTO_DIR, in generation order.
PROTO_FILES: tuple[str, ...] = (
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
    "runtime/v1/api.proto",
    # DRA mode's kubelet plugin (k8s.io/kubelet v0.37.2, byte for byte; plain proto3, no gogo imports).
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    # The optional DRAResourceHealth service, v1 (kubelet 1.37 prefers it) and v1alpha1 (what earlier kubelets
    # call; 1.37 still takes it). Upstream's directory is pkg/apis/dra-health/: "dra_health" here because a
    # Python package name cannot hold a hyphen (the files are byte for byte; they import nothing).
    "dra_health/v1/api.proto",
    "dra_health/v1alpha1/api.proto",
)

GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# Protos whose services are ttrpc (NRI): messages only, no gRPC stubs.
MESSAGE_ONLY_FILES: tuple[str, ...] = (
    "nri/v1alpha1/api.proto",
)
# ttrpc's Request/Response (NRI's transport). request.proto imports "google/rpc/status.proto" by that name, so
# protoc's Python imports it as ``google.rpc.status_pb2`` (googleapis-common-protos, not a dependency): the module is
# written to agent/_proto/googleapis/google/rpc/ and that one import line rewritten to it, here, so the regeneration
# test covers the edit.
TTRPC_FILES: tuple[str, ...] = ("ttrpc/request.proto",)
GOOGLEAPIS_DIR = "googleapis"
GOOGLEAPIS_FILES: tuple[str, ...] = ("google/rpc/status.proto",)
GOOGLE_RPC_IMPORT = "from google.rpc import status_pb2"
TTRPC_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi")
# No .pyi: NRI's enum Field has a value named None, which makes protoc's stub invalid Python
# (mypy skips following agent._proto.nri: pyproject.toml).
MESSAGE_SUFFIXES: tuple[str, ...] = ("_pb2.py",)


def expected_outputs(out_root: Path) -> list[Path]:
    """Paths `generate(out_root)` writes, in a stable order."""
    outputs: list[Path] = []
    for rel in PROTO_FILES:
        stem = Path(VIRTUAL_ROOT) / rel
        base = stem.with_suffix("")
        for suffix in GENERATED_SUFFIXES:
            outputs.append(out_root / base.parent / (base.name + suffix))
    for rel in MESSAGE_ONLY_FILES:
        base = (Path(VIRTUAL_ROOT) / rel).with_suffix("")
        for suffix in MESSAGE_SUFFIXES:
            outputs.append(out_root / base.parent / (base.name + suffix))
    for base in [*(Path(VIRTUAL_ROOT) / rel for rel in TTRPC_FILES),
                 *(Path(VIRTUAL_ROOT) / GOOGLEAPIS_DIR / rel for rel in GOOGLEAPIS_FILES)]:
        for suffix in TTRPC_SUFFIXES:
            outputs.append(out_root / base.parent / (base.with_suffix("").name + suffix))
    return outputs


def _generate_ttrpc(out_root: Path) -> None:
    """ttrpc's envelope and google.rpc.Status (see TTRPC_FILES), with the one import rewritten."""
    import tempfile
    from importlib.resources import files

    from grpc_tools import protoc

    package = f"{VIRTUAL_ROOT}/{GOOGLEAPIS_DIR}".replace("/", ".")
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "grpc_tools.protoc",
            f"-I{VIRTUAL_ROOT}/ttrpc={PROTO_DIR / 'ttrpc'}",
            f"-I{PROTO_DIR / GOOGLEAPIS_DIR}",
            f"-I{files('grpc_tools') / '_proto'}",  # google/protobuf/any.proto
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *(f"{VIRTUAL_ROOT}/{rel}" for rel in TTRPC_FILES),
            *GOOGLEAPIS_FILES,
        ]
        rc = protoc.main(command)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(command)}")
        moves = [(rel, rel) for rel in TTRPC_FILES]
        moves += [(rel, f"{GOOGLEAPIS_DIR}/{rel}") for rel in GOOGLEAPIS_FILES]
        for source, target in moves:
            for suffix in TTRPC_SUFFIXES:
                name = Path(source).with_suffix("").name + suffix
                src = Path(tmp) / (Path(VIRTUAL_ROOT) / source if source in TTRPC_FILES else Path(source)).parent
                text = (src / name).read_text()
                text = text.replace(GOOGLE_RPC_IMPORT, f"from {package}.google.rpc import status_pb2")
                dst = out_root / VIRTUAL_ROOT / Path(target).parent / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(text)


def generate(out_root: Path) -> list[Path]:
    """Run protoc (in-process, grpc_tools) and return the generated files under ``out_root``."""
    from grpc_tools import protoc  # imported lazily: only needed for code generation

    out_root = Path(out_root).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{VIRTUAL_ROOT}={PROTO_DIR}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(f"{VIRTUAL_ROOT}/{rel}" for rel in PROTO_FILES),
    ]
    messages_only = [
        "grpc_tools.protoc",
        f"-I{VIRTUAL_ROOT}={PROTO_DIR}",
        f"--python_out={out_root}",
        *(f"{VIRTUAL_ROOT}/{rel}" for rel in MESSAGE_ONLY_FILES),
    ]
    for command in (args, messages_only):
        rc = protoc.main(command)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(command)}")
    _generate_ttrpc(out_root)
    outputs = expected_outputs(out_root)
    missing = [p for p in outputs if not p.is_file()]
    if missing:
        raise RuntimeError(f"protoc did not produce: {', '.join(map(str, missing))}")
    return outputs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_root = Path(argv[0]) if argv else REPO_ROOT
    for path in generate(out_root):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
