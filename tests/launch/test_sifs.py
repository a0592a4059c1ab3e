"""build-sifs against the apptainer stand-in (tests/fake_apptainer): commands, skipping, manifest, failures."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from swe_megatron.launch.sifs import SifBuilder, build_command, sif_name, task_image
from swe_megatron.tasks.schema import Task

FAKE = Path(__file__).resolve().parents[1] / "fake_apptainer"


@pytest.fixture
def fake_apptainer(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
    registry = tmp_path / "registry.json"
    monkeypatch.setenv("FAKE_APPTAINER_REGISTRY", str(registry))
    return registry


def _task(iid: str, image: str = "") -> Task:
    return Task(iid, "o/r", "c0", "", "", "issue", [], [], docker_image=image)


def test_image_names_follow_swebench_and_rebench():
    assert (
        task_image(_task("django__django-11099"))
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert task_image(_task("Owner__Repo-7")) == "swebench/sweb.eval.x86_64.owner_1776_repo-7:latest"
    assert (  # SWE-rebench's docker_image names no tag: apptainer pulls ":latest", and so does the SIF's name
        task_image(_task("x__y-1", "swerebench/sweb.eval.x86_64.x_1776_y-1"))
        == "swerebench/sweb.eval.x86_64.x_1776_y-1:latest"
    )
    assert sif_name("swerebench/sweb.eval.x86_64.x_1776_y-1") == sif_name(
        "docker://swerebench/sweb.eval.x86_64.x_1776_y-1:latest"
    )
    assert (
        sif_name("swebench/sweb.eval.x86_64.a_1776_b-1:latest")
        == "swebench_sweb.eval.x86_64.a_1776_b-1_latest.sif"
    )
    assert sif_name("docker://r/i@sha256:ab") == "r_i_sha256_ab.sif"
    assert build_command("apptainer", "r/i:1", Path("/s/o.sif")) == [
        "apptainer",
        "build",
        "--force",
        "/s/o.sif",
        "docker://r/i:1",
    ]


def test_builds_in_parallel_skips_present_and_records_failures(fake_apptainer, tmp_path, monkeypatch):
    good = ["r/a:1", "r/b:1", "r/c@sha256:" + "0" * 64]
    fake_apptainer.write_text(json.dumps({img: {} for img in good}))
    monkeypatch.setenv("FAKE_APPTAINER_BUILD_SLEEP", "2")
    sif_dir = tmp_path / "sifs"
    b = SifBuilder(sif_dir, jobs=4)
    t0 = time.monotonic()
    recs = b.build_all([*good, "r/missing:1", "r/a:1"], progress=lambda line: None)
    took = time.monotonic() - t0
    assert [r.status for r in recs] == ["built", "built", "built", "failed"]  # duplicates built once
    assert took < 6.0, f"4 builds of 2 s with 4 jobs took {took:.1f} s (8 s one after another): not parallel"
    assert "manifest unknown" in recs[3].error
    manifest = json.loads((sif_dir / "manifest.json").read_text())
    assert manifest["format"] == 1 and set(manifest["images"]) == {*good, "r/missing:1"}
    a = manifest["images"]["r/a:1"]
    assert a["sif"] == "r_a_1.sif" and a["size_bytes"] > 0 and a["built_at"] and a["build_s"] >= 2
    assert manifest["images"][good[2]]["digest"] == "sha256:" + "0" * 64
    assert json.loads((sif_dir / "r_a_1.sif").read_text())["source"] == "r/a:1"  # a SIF the stand-in runs
    assert not list(sif_dir.glob("*.partial")) and not (sif_dir / sif_name("r/missing:1")).exists()

    # second pass: nothing rebuilt, the failure retried (and failing again), the manifest kept
    monkeypatch.setenv("FAKE_APPTAINER_BUILD_SLEEP", "0")
    mtime = (sif_dir / "r_a_1.sif").stat().st_mtime_ns
    recs = SifBuilder(sif_dir, jobs=2).build_all([*good, "r/missing:1"], progress=lambda line: None)
    assert [r.status for r in recs] == ["present", "present", "present", "failed"]
    assert (sif_dir / "r_a_1.sif").stat().st_mtime_ns == mtime
    assert json.loads((sif_dir / "manifest.json").read_text())["images"]["r/a:1"]["built_at"] == a["built_at"]
    recs = SifBuilder(sif_dir, jobs=2, force=True).build_all(["r/a:1"], progress=lambda line: None)
    assert recs[0].status == "built"


def test_manifest_writes_are_atomic_under_concurrency(fake_apptainer, tmp_path):
    images = [f"r/i{i}:1" for i in range(12)]
    fake_apptainer.write_text(json.dumps({img: {} for img in images}))
    sif_dir = tmp_path / "sifs"
    seen_bad = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            p = sif_dir / "manifest.json"
            if p.exists():
                try:
                    json.loads(p.read_text())
                except ValueError:
                    seen_bad.append(1)

    t = threading.Thread(target=reader)
    t.start()
    SifBuilder(sif_dir, jobs=6).build_all(images, progress=lambda line: None)
    stop.set()
    t.join()
    assert not seen_bad
    assert len(json.loads((sif_dir / "manifest.json").read_text())["images"]) == 12


def test_cli_reports_failures_and_exit_status(fake_apptainer, tmp_path, capsys):
    from swe_megatron.cli import main
    from swe_megatron.tasks.load import write_tasks

    fake_apptainer.write_text(json.dumps({"swebench/sweb.eval.x86_64.a_1776_b-1:latest": {}}))
    tasks = tmp_path / "tasks.jsonl"
    write_tasks([_task("a__b-1"), _task("c__d-2")], tasks)
    rc = main(["build-sifs", str(tasks), "--sif-dir", str(tmp_path / "sifs"), "--jobs", "2"])
    out, err = capsys.readouterr()
    assert rc == 1 and "1 built, 0 already present, 1 failed" in out
    assert "FAILED swebench/sweb.eval.x86_64.c_1776_d-2:latest" in err
    assert main(["build-sifs", str(tasks)]) == 2  # no folder: one clear message
    assert "--sif-dir" in capsys.readouterr().err


@pytest.mark.sandbox
def test_apptainer_backend_opens_a_built_sif(fake_apptainer, tmp_path):
    """The SIF name build-sifs writes is the one the apptainer backend finds through sandbox.sif_dir."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing (tools/sandbox_setup.sh)")
    from swe_megatron.config.schema import SandboxBackend, SandboxConfig
    from swe_megatron.sandbox import SandboxSpec, make_sandbox
    from swe_megatron.sandbox.users import lookup_user

    image = "swebench/sweb.eval.x86_64.a_1776_b-1:latest"
    import tempfile

    fake_apptainer.write_text(json.dumps({image: {}}))
    shared = Path(tempfile.mkdtemp(prefix="swe-sifs-test-", dir="/var/tmp"))  # readable by the sandbox user
    shared.chmod(0o755)
    sif_dir = shared / "sifs"
    assert SifBuilder(sif_dir).build_one(image).status == "built"
    cfg = SandboxConfig(backend=SandboxBackend.apptainer, sif_dir=str(sif_dir), cgroup_limits=False)
    if os.geteuid() == 0:
        try:
            lookup_user(cfg.user)
        except Exception:  # noqa: BLE001
            pytest.skip("sandbox user missing (tools/sandbox_setup.sh)")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f.txt").write_text("hi\n")
    try:
        with make_sandbox(SandboxSpec(repo_dir=str(repo), image=sif_name(image)), cfg) as sb:
            r = sb.exec("cat f.txt", timeout_s=30)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert r.exit_code == 0 and b"hi" in r.output
