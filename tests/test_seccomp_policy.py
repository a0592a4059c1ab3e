"""The sandbox's seccomp policy (sandbox/seccomp.py) checked call by call against its effect, without bwrap.

The program filter_program() builds (the bytes bwrap's --seccomp reads) is loaded into a child Python with
prctl, and the child then really attempts each call: ptrace-attach, read and write the memory of, take an
fd from, compare kernel objects with and madvise another process of the same user (its own fork), and calls
into kernel surfaces no test suite needs. A control child without the filter shows the attacks work there.
To tell the filter's refusal from the kernel's own EPERM, one run loads the program with its refusal errno
rewritten to ENOTUNIQ (no syscall here returns it): only a refusal by the filter yields that errno.
The 32-bit ABIs (int 0x80, x32) are called from a few bytes of machine code: a filter without them kills
the process (SIGSYS) where it must answer EPERM. The bwrap path is in sandbox/test_sandbox_security.py.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import signal
import struct
import subprocess
import sys

import pytest

sc = pytest.importorskip("pyseccomp")
if platform.machine() != "x86_64":
    pytest.skip("the probes resolve x86_64 call numbers and run x86 machine code", allow_module_level=True)

from swe_megatron.sandbox.base import SandboxError  # noqa: E402
from swe_megatron.sandbox.seccomp import REFUSED, filter_program  # noqa: E402

REACH_INTO_ANOTHER = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "process_madvise",
)
"""What a process of the sandbox's one uid could do to the shell, the eval script or its timeout."""
SURFACES = ("perf_event_open", "bpf", "userfaultfd", "keyctl", "add_key", "request_key")
"""Kernel surfaces the module docstring refuses (no test suite needs them)."""
ALLOWED = ("getpid", "pidfd_open", "kill", "socket", "fork_and_wait")
"""What test suites do: these must keep working under the filter."""
MARK = errno.ENOTUNIQ

CHILD = r"""
import ctypes, json, os, signal, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr, program = json.loads(sys.argv[1]), sys.argv[2]
buf = ctypes.create_string_buffer(b"original", 16)
target = os.fork()
if target == 0:
    time.sleep(30)
    os._exit(0)

def call(name, *args):
    libc.syscall.argtypes = None
    rc = libc.syscall(ctypes.c_long(nr[name]), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return 0 if rc >= 0 else ctypes.get_errno()

if program:
    data = open(program, "rb").read()
    fprog = struct.pack("HxxxxxxP", len(data) // 8, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0, os.strerror(ctypes.get_errno())  # filter mode
out = {}
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 16)
out["ptrace"] = call("ptrace", 16, target, 0, 0)  # PTRACE_ATTACH
if out["ptrace"] == 0:
    os.waitpid(target, 0)
    call("ptrace", 17, target, 0, 0)  # PTRACE_DETACH
out["process_vm_readv"] = call("process_vm_readv", target, iov, 1, iov, 1, 0)
out["process_vm_writev"] = call("process_vm_writev", target, iov, 1, iov, 1, 0)
pidfd = libc.syscall(ctypes.c_long(nr["pidfd_open"]), ctypes.c_long(target), ctypes.c_long(0))
out["pidfd_open"] = 0 if pidfd >= 0 else ctypes.get_errno()
out["pidfd_getfd"] = call("pidfd_getfd", pidfd, 0, 0)
out["kcmp"] = call("kcmp", os.getpid(), target, 0, 0, 0)  # KCMP_FILE, fd 0 of both
out["process_madvise"] = call("process_madvise", pidfd, iov, 1, 20, 0)  # MADV_COLD
out["perf_event_open"] = call("perf_event_open", 0, 0, -1, -1, 0)
out["bpf"] = call("bpf", 0, 0, 0)
out["userfaultfd"] = call("userfaultfd", 0)
out["keyctl"] = call("keyctl", 0, 0, 0, 0, 0)
out["add_key"] = call("add_key", 0, 0, 0, 0, 0)
out["request_key"] = call("request_key", 0, 0, 0, 0)
out["getpid"] = call("getpid")
out["kill"] = call("kill", target, 0)
out["socket"] = call("socket", 1, 1, 0)  # AF_UNIX, SOCK_STREAM
child = os.fork()
if child == 0:
    os._exit(7)
out["fork_and_wait"] = 0 if os.waitpid(child, 0)[1] == 7 << 8 else -1
os.kill(target, signal.SIGKILL)
print(json.dumps(out))
"""

# x86 machine code called through ctypes: a 32-bit ptrace(-1, 0, 0) by `int 0x80`, and an x32 one by `syscall`;
# both return the negative errno in eax.
INT80 = "53 b8{nr} bbffffffff 31c9 31d2 cd80 5b c3"
X32 = "b8{nr} bfffffffff 31f6 31d2 0f05 c3"
ABI_CHILD = r"""
import ctypes, mmap, struct, sys
code, program = bytes.fromhex(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
if program:
    data = open(program, "rb").read()
    fprog = struct.pack("HxxxxxxP", len(data) // 8, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value)
    assert libc.prctl(38, 1, 0, 0, 0) == 0
    assert libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0
mem = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
mem.write(code)
fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(mem)))
print(-fn())
"""


def _program(tmp_path, refusal_errno: int | None = None):
    """filter_program() in a file; refusal_errno: its SECCOMP_RET_ERRNO|EPERM returns rewritten to that errno."""
    data = bytearray(filter_program())
    if refusal_errno is not None:
        rewritten = 0
        for i in range(0, len(data), 8):
            code, jt, jf, k = struct.unpack_from("HBBI", data, i)
            if code == 0x06 and k == 0x00050000 | errno.EPERM:  # BPF_RET|BPF_K, SECCOMP_RET_ERRNO
                struct.pack_into("HBBI", data, i, code, jt, jf, 0x00050000 | refusal_errno)
                rewritten += 1
        assert rewritten, "the program never returns EPERM"
    path = tmp_path / f"filter-{refusal_errno}.bpf"
    path.write_bytes(bytes(data))
    return str(path)


def _probe(program: str) -> dict[str, int]:
    """{call: errno it ended with, 0 if it succeeded} in a child under `program` ("": no filter)."""
    names = set(REACH_INTO_ANOTHER + SURFACES + ALLOWED + REFUSED) - {"fork_and_wait"}
    nr = {n: sc.resolve_syscall(sc.Arch.X86_64, n) for n in names}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(nr), program], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, f"probe ended with {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, int]]:
    """The probe's results without a filter, under the program as built, and under it with ENOTUNIQ refusals."""
    tmp = tmp_path_factory.mktemp("seccomp")
    return {"none": _probe(""), "built": _probe(_program(tmp)), "marked": _probe(_program(tmp, MARK))}


def test_the_attacks_work_without_the_filter(outcomes):
    """Control: every reach into the same user's process succeeds unfiltered, so a refusal below is the filter's."""
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"):
        assert outcomes["none"][name] == 0, (name, os.strerror(outcomes["none"][name]))
    assert all(v != MARK for v in outcomes["none"].values()), outcomes["none"]


@pytest.mark.parametrize("name", REACH_INTO_ANOTHER + SURFACES)
def test_each_call_the_policy_names_is_refused_with_eperm(outcomes, name):
    """Refused by the filter itself (the ENOTUNIQ run), and with EPERM in the program as bwrap loads it."""
    assert outcomes["marked"][name] == MARK, (
        f"{name}: {os.strerror(outcomes['marked'][name])}, not the filter's"
    )
    assert outcomes["built"][name] == errno.EPERM, f"{name}: {os.strerror(outcomes['built'][name])}"


def test_every_entry_of_the_table_takes_effect(outcomes):
    """Whatever REFUSED lists is refused by the program (an entry the build drops would pass silently)."""
    probed = set(outcomes["marked"])
    assert set(REFUSED) <= probed, f"no probe for {sorted(set(REFUSED) - probed)}: add one to CHILD"
    assert {n for n in REFUSED if outcomes["marked"][n] != MARK} == set()


@pytest.mark.parametrize("name", ALLOWED)
def test_what_test_suites_do_still_works(outcomes, name):
    assert outcomes["built"][name] == 0, f"{name}: {os.strerror(outcomes['built'][name])}"


def _abi_call(code: bytes, program: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ABI_CHILD, code.hex(), program], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    "abi, template, arch", [("int 0x80", INT80, "X86"), ("x32", X32, "X32")], ids=["i386", "x32"]
)
def test_32_bit_abis_are_filtered_too(tmp_path, abi, template, arch):
    """ptrace through a 32-bit ABI is refused with EPERM, not left unfiltered nor killed by SIGSYS."""
    nr = struct.pack("<I", sc.resolve_syscall(getattr(sc.Arch, arch), "ptrace")).hex()
    code = bytes.fromhex(template.format(nr=nr).replace(" ", ""))
    control = _abi_call(code, "")
    if control.returncode != 0:
        pytest.skip(
            f"this kernel cannot run the {abi} call at all ({control.returncode}: {control.stderr[-300:]})"
        )
    assert int(control.stdout) not in (errno.EPERM, MARK)
    for program, want in ((_program(tmp_path), errno.EPERM), (_program(tmp_path, MARK), MARK)):
        run = _abi_call(code, program)
        assert run.returncode != -signal.SIGSYS, (
            f"{abi} ptrace killed the process (SIGSYS): its ABI is unfiltered"
        )
        assert run.returncode == 0 and int(run.stdout) == want, (
            abi,
            run.returncode,
            run.stdout,
            run.stderr[-500:],
        )


def test_without_libseccomp_the_error_names_the_fix(monkeypatch):
    """pyseccomp missing (or finding no libseccomp): one SandboxError that says what to install, and where."""
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import raises ImportError
    filter_program.cache_clear()
    try:
        with pytest.raises(SandboxError) as info:
            filter_program()
    finally:
        filter_program.cache_clear()
    assert str(info.value).startswith("cannot build the sandbox's seccomp filter (")
    assert str(info.value).endswith(
        "): install libseccomp2 (tools/sandbox_setup.sh) and pyseccomp (requirements/cpu.txt)"
    )
