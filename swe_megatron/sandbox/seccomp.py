"""The bwrap sandbox's seccomp filter: system calls that reach into other processes are refused (EPERM).

Everything in a sandbox runs as one uid, so without it the tested code could PTRACE_ATTACH the shell, the
eval script or its `timeout` (stop them, rewrite their memory) or read and write their memory with
process_vm_readv/writev. bwrap loads the program (`--seccomp FD`) into the sandbox's first process; every
process started inside inherits it and cannot remove it. Everything else is allowed: test suites fork,
signal, thread, mmap and use sockets as before.

Refused (errno EPERM), with why:
- ptrace, process_vm_readv, process_vm_writev, process_madvise, pidfd_getfd, kcmp: reach into, or
  compare the kernel objects of, another process;
- perf_event_open: observes other processes (and is a large kernel surface);
- bpf, userfaultfd, keyctl, add_key, request_key: kernel surfaces no test suite needs, refused by
  container runtimes' default profiles too.

The program is built once per process with libseccomp (the pyseccomp binding) for the machine's own
architecture and its 32-bit ABIs (so `int 0x80` cannot call an unfiltered ptrace).
"""

from __future__ import annotations

import errno
import functools
import tempfile

from swe_megatron.sandbox.base import SandboxError

REFUSED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
)
"""System calls the sandbox refuses with EPERM (the module docstring says why each)."""
SETUP_HINT = "install libseccomp2 (tools/sandbox_setup.sh) and pyseccomp (requirements/cpu.txt)"


@functools.lru_cache(maxsize=1)
def filter_program() -> bytes:
    """The compiled BPF program (what bwrap's --seccomp reads); SandboxError naming the fix without libseccomp."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as e:  # RuntimeError: pyseccomp found no libseccomp
        raise SandboxError(f"cannot build the sandbox's seccomp filter ({e}): {SETUP_HINT}") from None
    flt = sc.SyscallFilter(sc.ALLOW)
    compat = {sc.Arch.X86_64: (sc.Arch.X86, sc.Arch.X32), sc.Arch.AARCH64: (sc.Arch.ARM,)}
    for arch in compat.get(sc.system_arch(), ()):
        flt.add_arch(arch)
    for name in REFUSED:
        flt.add_rule(sc.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()
