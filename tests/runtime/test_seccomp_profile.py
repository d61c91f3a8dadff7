"""The seccomp profile for vLLM pods: valid OCI, compiled by the real libseccomp as runc compiles it,
and installed on the node only when it differs."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.errors import UsageError
from agent.node import seccomp
from tests.support.env import missing

NUMA_CALLS = ("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages")
GOARCHES = ("s390x", "amd64", "arm64")

# The OCI runtime-spec's seccomp object (schema/config-linux.json "seccomp", schema/defs-linux.json
# "SeccompAction", "SeccompArch", "SeccompFlag", "SeccompOperators", "Syscall", "SyscallArg"),
# restated: the schema is what a runtime promises to accept.
ACTIONS = {"SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_TRAP", "SCMP_ACT_ERRNO",
           "SCMP_ACT_TRACE", "SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_NOTIFY"}
ARCHES = {"SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32", "SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64",
          "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32", "SCMP_ARCH_MIPSEL", "SCMP_ARCH_MIPSEL64",
          "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PPC", "SCMP_ARCH_PPC64", "SCMP_ARCH_PPC64LE", "SCMP_ARCH_S390",
          "SCMP_ARCH_S390X", "SCMP_ARCH_PARISC", "SCMP_ARCH_PARISC64", "SCMP_ARCH_RISCV64"}
OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6,
       "SCMP_CMP_MASKED_EQ": 7}  # with libseccomp's enum scmp_compare values
UINT64 = 2**64


def load(goarch: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(seccomp.profile(goarch))
    return data


def oci_errors(p: dict[str, Any]) -> list[str]:
    errors = []
    if set(p) - {"defaultAction", "defaultErrnoRet", "architectures", "flags", "listenerPath", "listenerMetadata",
                 "syscalls"}:
        errors.append(f"unknown keys {set(p)}")
    if p.get("defaultAction") not in ACTIONS:
        errors.append("defaultAction")
    if not isinstance(p.get("defaultErrnoRet", 0), int):
        errors.append("defaultErrnoRet")
    if not set(p.get("architectures", [])) <= ARCHES:
        errors.append("architectures")
    for rule in p.get("syscalls", []):
        if set(rule) - {"names", "action", "errnoRet", "args"} or not rule.get("names") or \
                not all(isinstance(n, str) for n in rule["names"]) or rule.get("action") not in ACTIONS:
            errors.append(f"rule {rule}")
        for arg in rule.get("args", []):
            if set(arg) - {"index", "value", "valueTwo", "op"} or arg.get("op") not in OPS or \
                    not all(isinstance(arg.get(k, 0), int) and 0 <= arg.get(k, 0) < UINT64
                            for k in ("index", "value", "valueTwo")):
                errors.append(f"arg {arg}")
    return errors


@pytest.mark.parametrize("goarch", GOARCHES)
def test_each_profile_is_oci_seccomp_and_allows_the_numa_calls_unconditionally(goarch: str) -> None:
    p = load(goarch)
    assert oci_errors(p) == []
    assert p["defaultAction"] == "SCMP_ACT_ERRNO" and p.get("defaultErrnoRet") == 1
    assert "flags" not in p  # runc 1.1 rejects any flag
    allowed = {n for r in p["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}
    assert set(NUMA_CALLS) <= allowed
    assert not {"unshare", "mount", "setns", "bpf", "keyctl"} & allowed  # still RuntimeDefault's guards
    endian = {"SCMP_ARCH_S390X": "big", "SCMP_ARCH_S390": "big"}
    assert len({endian.get(a, "little") for a in p["architectures"]}) == 1, "libseccomp refuses mixed endianness"


def test_the_bad_input_checks_can_fail() -> None:
    assert oci_errors({"defaultAction": "ALLOW", "syscalls": [{"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                                              "args": [{"index": 0, "value": -1, "op": "EQ"}]}]})


# --- compiled by the real libseccomp, the way runc's libcontainer/seccomp/seccomp_linux.go does --------

LIBSECCOMP = ctypes.util.find_library("seccomp")
NATIVE_ARCH = {"s390x": "s390x", "amd64": "x86_64", "arm64": "aarch64"}
SCMP_ARCH_NAMES = {"SCMP_ARCH_S390X": "s390x", "SCMP_ARCH_S390": "s390", "SCMP_ARCH_X86_64": "x86_64",
                   "SCMP_ARCH_X86": "x86", "SCMP_ARCH_X32": "x32", "SCMP_ARCH_AARCH64": "aarch64",
                   "SCMP_ARCH_ARM": "arm"}


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def action(name: str, errno: int | None) -> int:
    return 0x7FFF0000 if name == "SCMP_ACT_ALLOW" else 0x00050000 | ((1 if errno is None else errno) & 0xFFFF)


def compile_with_libseccomp(p: dict[str, Any], native: str) -> int:
    """BPF instructions of the filter runc would load on a ``native`` node (raises on any libseccomp error)."""
    lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    argtypes: dict[str, list[Any]] = {
        "seccomp_arch_add": [ctypes.c_uint32], "seccomp_arch_remove": [ctypes.c_uint32],
        "seccomp_export_bpf": [ctypes.c_int],
        "seccomp_rule_add_array": [ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp)]}
    for fn, types in argtypes.items():
        getattr(lib, fn).argtypes = [ctypes.c_void_p, *types]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    default = action(p["defaultAction"], p.get("defaultErrnoRet"))
    ctx = lib.seccomp_init(default)
    assert ctx
    try:
        token = lib.seccomp_arch_resolve_name(native.encode())
        assert lib.seccomp_arch_remove(ctx, 0) == 0  # this test machine's own arch out: emulate the node's
        assert lib.seccomp_arch_add(ctx, token) == 0
        for arch in p["architectures"]:
            rc = lib.seccomp_arch_add(ctx, lib.seccomp_arch_resolve_name(SCMP_ARCH_NAMES[arch].encode()))
            assert rc in (0, -17), f"seccomp_arch_add({arch}) = {rc}"  # -EEXIST is ignored, like runc
        for rule in p["syscalls"]:
            act = action(rule["action"], rule.get("errnoRet"))
            if act == default:
                continue
            args = (ArgCmp * max(1, len(rule.get("args", []))))(*[
                ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in rule.get("args", [])])
            for name in rule["names"]:
                # Numbers are the native arch's; libseccomp translates them for each arch of the filter
                # by name (a name another arch lacks is a pseudo number, dropped for that arch).
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number == -1:  # unknown to libseccomp: runc skips it
                    continue
                rc = lib.seccomp_rule_add_array(ctx, act, number, len(rule.get("args", [])), args)
                assert rc == 0, f"{name}: seccomp_rule_add_array = {rc}"
        for name in NUMA_CALLS:
            assert lib.seccomp_syscall_resolve_name_arch(token, name.encode()) >= 0, name
        with tempfile.TemporaryFile() as out:
            assert lib.seccomp_export_bpf(ctx, out.fileno()) == 0
            return os.fstat(out.fileno()).st_size // 8
    finally:
        lib.seccomp_release(ctx)


def need_libseccomp() -> None:
    if LIBSECCOMP is None:
        missing("libseccomp", "apt-get install libseccomp2 (.ci/run installs it)")


@pytest.mark.parametrize("goarch", GOARCHES)
def test_libseccomp_compiles_each_profile_for_its_node(goarch: str) -> None:
    need_libseccomp()
    instructions = compile_with_libseccomp(load(goarch), NATIVE_ARCH[goarch])
    assert 0 < instructions < 4096  # the kernel's BPF_MAXINSNS


def test_libseccomp_refuses_one_file_for_every_architecture() -> None:
    """Why there is one file per architecture: the check above can fail."""
    need_libseccomp()
    mixed = {**load("s390x"), "architectures": ["SCMP_ARCH_S390X", "SCMP_ARCH_X86_64"]}
    with pytest.raises(AssertionError, match="seccomp_arch_add"):
        compile_with_libseccomp(mixed, "s390x")


def test_install_writes_the_nodes_profile_once_and_says_so(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "seccomp" / "profiles"
    assert main(["seccomp-profile", "--install", str(target), "--arch", "s390x"]) == 0
    assert (target / "vllm-numa.json").read_bytes() == seccomp.profile("s390x")
    assert (target / "vllm-numa.json").stat().st_mode & 0o777 == 0o644
    mtime = (target / "vllm-numa.json").stat().st_mtime_ns
    assert main(["seccomp-profile", "--install", str(target), "--arch", "s390x"]) == 0
    assert (target / "vllm-numa.json").stat().st_mtime_ns == mtime
    assert "unchanged" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["vllm-numa.json"]  # no temporary file left


def test_bad_arch_and_unwritable_directory_are_one_line_errors(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["seccomp-profile", "--arch", "sparc"]) == 2
    (tmp_path / "file").write_text("x")
    assert main(["seccomp-profile", "--install", str(tmp_path / "file" / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err
    with pytest.raises(UsageError):
        seccomp.profile("mips")
