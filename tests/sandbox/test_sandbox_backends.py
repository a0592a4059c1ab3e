"""The apptainer backend against the stand-in CLI (tests/fake_apptainer), the local backend, the lookup table."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from swe_megatron.config import ConfigError
from swe_megatron.config.schema import SandboxBackend
from swe_megatron.sandbox import BACKENDS, SandboxError, SandboxSpec, backend_class, make_sandbox

pytestmark = pytest.mark.sandbox

FAKE = Path(__file__).resolve().parents[1] / "fake_apptainer"


@pytest.fixture
def apptainer_cfg(cfg, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE}:{os.environ['PATH']}")
    return replace(cfg, backend=SandboxBackend.apptainer)


@pytest.fixture
def sif(venv) -> Path:
    """A stand-in image whose Python environment is the test venv (world-readable, like a SIF on disk)."""
    path = venv.parent / "task.sif"
    path.write_text(json.dumps({"fake_sif": 1, "env_dir": str(venv)}))
    path.chmod(0o644)
    return path


def test_apptainer_backend_runs_the_shell_in_the_image(apptainer_cfg, repo, sif):
    sb = make_sandbox(SandboxSpec(repo_dir=str(repo), image=str(sif), env={"TASK": "t1"}), apptainer_cfg)
    sb.start()
    try:
        launcher = sb._shell.launcher
        i = launcher.index("exec")
        assert launcher[i - 1].endswith("fake_apptainer/apptainer")
        for flag in ("--contain", "--cleanenv", "--no-home", "--net", "--writable-tmpfs", "--pid"):
            assert flag in launcher[i:]
        assert launcher[launcher.index("--network") + 1] == "none"
        assert launcher[launcher.index("--bind") + 1] == f"{sb.workspace.repo}:/testbed"
        res = sb.exec("pwd; echo $TASK; id -u; python -c 'import sys; print(sys.prefix)'")
        assert res.output.decode().split() == [
            "/testbed",
            "t1",
            str(pwd.getpwnam("swe-sandbox").pw_uid),
            "/opt/venv",
        ]
        assert sb.exec("cat /work/main/pyproject.toml /etc/shadow").exit_code != 0
        net = sb.exec("python -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
        assert net.exit_code != 0 and (b"OSError" in net.output or b"unreachable" in net.output)
        sb.exec("cd pkg; export KEEP=1")
        assert sb.exec("sleep 20", timeout_s=1).timed_out
        assert sb.exec("pwd; echo $KEEP").output == b"/testbed/pkg\n1\n"
        sb.write_file("pkg/new.py", b"x = 1\n")
        assert sb.exec("cat new.py").output == b"x = 1\n"
        assert sb.read_file("/testbed/pkg/__init__.py").startswith(b"def add")
        folder = sb.workspace.folder
    finally:
        sb.stop()
    assert not folder.exists()


def test_apptainer_backend_errors_name_the_fix(apptainer_cfg, repo, sif, monkeypatch):
    with pytest.raises(SandboxError, match="needs SandboxSpec.image"):
        make_sandbox(SandboxSpec(repo_dir=str(repo)), apptainer_cfg).start()
    with pytest.raises(SandboxError, match="not found"):
        make_sandbox(SandboxSpec(repo_dir=str(repo), image="missing.sif"), apptainer_cfg).start()
    relative = replace(apptainer_cfg, sif_dir=str(sif.parent))  # names resolve inside sandbox.sif_dir
    sb = make_sandbox(SandboxSpec(repo_dir=str(repo), image=sif.name), relative)
    sb.start()
    sb.stop()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(SandboxError, match="apptainer is not installed"):
        make_sandbox(SandboxSpec(repo_dir=str(repo), image=str(sif)), apptainer_cfg).start()


def test_the_stand_in_refuses_what_it_does_not_implement(sif):
    def run(*args, user=None):
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
        return subprocess.run(
            [*prefix, str(FAKE / "apptainer"), *args], capture_output=True, text=True, timeout=30
        )

    res = run("instance", "start", str(sif), "x")
    assert res.returncode == 255 and "unsupported command" in res.stderr
    res = run("exec", "--fakeroot", str(sif), "true")
    assert res.returncode == 255 and "unsupported option --fakeroot" in res.stderr
    res = run("exec", "--contain", str(sif), "true")
    assert res.returncode == 255 and "refusing to run as root" in res.stderr
    uid = pwd.getpwnam("swe-sandbox").pw_uid
    res = run("exec", "--net", "--network", "bridge", str(sif), "true", user=uid)
    assert res.returncode == 255 and "unsupported network" in res.stderr
    res = run("exec", "--contain", "--cleanenv", "--net", "--network", "none", str(sif), "id", "-u", user=uid)
    assert res.returncode == 0 and res.stdout.strip() == str(uid)


def test_local_backend_is_refused_unless_enabled(cfg, repo):
    local = replace(cfg, backend=SandboxBackend.local)
    with pytest.raises(ConfigError, match="allow_local=true"):
        make_sandbox(SandboxSpec(repo_dir=str(repo)), local)
    sb = make_sandbox(SandboxSpec(repo_dir=str(repo), env={"A": "1"}), replace(local, allow_local=True))
    sb.start()
    try:
        res = sb.exec("echo $A; cat README.md; echo changed > README.md; pwd")
        assert res.output.decode().split("\n")[:2] == ["1", "toy"]
        assert res.output.decode().split("\n")[2] == str(sb.workspace.repo)
        assert (repo / "README.md").read_text() == "toy\n"  # a copy
        assert sb.exec("sleep 20", timeout_s=1).timed_out
        assert sb.exec("echo $A").output == b"1\n"
        assert sb.read_file("/testbed/README.md") == b"changed\n"
    finally:
        sb.stop()


def test_backend_lookup_by_name():
    assert set(BACKENDS) == {"bwrap", "apptainer", "local"}
    for name in BACKENDS:
        assert backend_class(name).backend == name
    assert backend_class(SandboxBackend.bwrap).backend == "bwrap"
    with pytest.raises(ConfigError, match="unknown"):
        backend_class("docker")


def test_an_image_task_works_on_a_copy_of_the_image_s_repository(apptainer_cfg, cfg, venv, tmp_path):
    """SandboxSpec without repo_dir: the apptainer backend copies the image's /testbed (read out once per image,
    files, folders and links only), runs spec.setup before entering it; bwrap refuses such a task in one line."""
    image = venv.parent / "image.sif"  # a folder image (the stand-in runs its top-level folders)
    testbed = image / "testbed"
    testbed.mkdir(parents=True)
    (testbed / "mod.py").write_text("x = 1\n")
    os.mkfifo(testbed / "pipe")
    subprocess.run(["git", "init", "-q", str(testbed)], check=True)
    subprocess.run(["git", "-C", str(testbed), "add", "mod.py"], check=True)
    subprocess.run(
        ["git", "-C", str(testbed), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
        check=True,
    )
    subprocess.run(["chmod", "-R", "a+rX", str(image)], check=True)
    apptainer_cfg = replace(apptainer_cfg, workspace_root=str(venv.parent / "workspaces"))
    spec = SandboxSpec(repo_dir="", image=str(image), setup=("export FROM_SETUP=1", "cd /"))
    for _ in range(2):
        sb = make_sandbox(spec, apptainer_cfg)
        sb.start()
        try:
            assert sb.exec("pwd; cat mod.py; echo $FROM_SETUP; ls").output == b"/testbed\nx = 1\n1\nmod.py\n"
            sb.write_file("mod.py", b"x = 2\n")
            assert "+x = 2" in sb.host_patch(1 << 20) and "+x = 2" in sb.exec("git diff").output.decode()
        finally:
            sb.stop()
    cached = list((Path(apptainer_cfg.workspace_root) / ".image-repos").glob("image.sif-*"))
    assert len(cached) == 1 and (cached[0] / "mod.py").read_text() == "x = 1\n"  # the image's, untouched
    assert {p.stat().st_uid for p in [cached[0], *cached[0].rglob("*")]} == {os.getuid()}
    with pytest.raises(SandboxError, match="only sandbox.backend=apptainer opens"):
        make_sandbox(spec, cfg).start()


def test_image_repositories_are_evicted_least_recently_used_never_while_held(apptainer_cfg, venv):
    """sandbox.image_repo_cache_mb bounds .image-repos: reading a new image's repository removes the least recently
    used ones that no live sandbox holds, never the held one (whose sandbox still diffs against it) nor the one just
    read; a leftover of a read cut short goes too."""
    images = []
    for name in "abc":
        testbed = venv.parent / "images" / f"{name}.sif" / "testbed"
        testbed.mkdir(parents=True)
        (testbed / "mod.py").write_text("x = 1\n")
        (testbed / "big.bin").write_bytes(os.urandom(700 << 10))  # any two of them exceed the 1 MB allowed
        subprocess.run(["git", "init", "-q", str(testbed)], check=True)
        subprocess.run(["git", "-C", str(testbed), "add", "."], check=True)
        subprocess.run(["git", "-C", str(testbed), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b"],
                       check=True)  # fmt: skip
        images.append(testbed.parent)
    subprocess.run(["chmod", "-R", "a+rX", str(venv.parent / "images")], check=True)
    cfg = replace(apptainer_cfg, workspace_root=str(venv.parent / "ws-evict"), image_repo_cache_mb=1)
    cache = Path(cfg.workspace_root) / ".image-repos"

    def cached() -> list[str]:
        return sorted(p.name.split(".sif-")[0] for p in cache.iterdir() if p.is_dir() and p.name[0] != ".")

    def read(image: Path) -> None:
        sb = make_sandbox(SandboxSpec(repo_dir="", image=str(image)), cfg)
        sb.start()
        sb.stop()

    held = make_sandbox(SandboxSpec(repo_dir="", image=str(images[0])), cfg)
    held.start()
    try:
        stale = cache / ".part-cut-short"
        stale.mkdir()
        os.utime(stale, (0, 0))
        read(images[1])
        assert cached() == ["a", "b"]  # over the limit, but a is held and b was just read
        read(images[2])
        assert cached() == ["a", "c"] and not stale.exists()  # b, the least recently used one not held
        held.write_file("mod.py", b"x = 2\n")
        assert "+x = 2" in held.host_patch(1 << 20)
    finally:
        held.stop()
    read(images[1])
    assert cached() == ["b"]  # a no longer held: it and c go
