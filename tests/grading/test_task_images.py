"""SWE-bench and SWE-rebench rows graded and rolled out in their task image (issue 39 items 2 and 4), offline: a
folder image in SWE-bench's layout built here from a factory task (tests/task_image.py), run by the apptainer backend
against the stand-in apptainer (tests/fake_apptainer), the repository from the image's /testbed, the environment
activated as the rows' eval scripts do it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from attacks import REWRITE_HOOK, RUNNER_ATTACKS
from task_image import ENV, build_image, rebench_row, swebench_row
from tiny_task import diff

from swe_megatron.config.schema import SandboxBackend, SandboxConfig
from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_many
from swe_megatron.sandbox import make_sandbox
from swe_megatron.tasks.load import load_tasks_for_command

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e]

FAKE = Path(__file__).resolve().parents[1] / "fake_apptainer"
DATASETS = ("swebench", "swe-rebench")


@pytest.fixture(scope="module")
def images(factory_task_files):
    """{dataset: (the task loaded from its row, sandbox config)} for one factory task with one test file, its
    images in a world-readable sif_dir, the stand-in apptainer first on PATH."""
    if not shutil.which("bwrap"):
        pytest.skip("bwrap is not installed (the stand-in apptainer runs over it)")
    source = next(
        (t for path, limit in factory_task_files for t in load_tasks_for_command(str(path))[:limit]
         if len(t.extra.get("test_files") or []) == 1),
        None,
    )  # fmt: skip
    if source is None:
        pytest.skip("no factory task with one test file")
    folder = Path(tempfile.mkdtemp(prefix="swe-task-images-", dir="/var/tmp"))
    folder.chmod(0o755)
    sif_dir = folder / "sifs"
    sif_dir.mkdir(mode=0o755)
    cfg = replace(SandboxConfig(), backend=SandboxBackend.apptainer, sif_dir=str(sif_dir))
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
        for dataset, row in (("swebench", swebench_row(source)), ("swe-rebench", rebench_row(source))):
            build_image(source, sif_dir, dataset)
            rows = folder / f"{dataset}.jsonl"
            rows.write_text(json.dumps(row) + "\n")
            (task,) = load_tasks_for_command(str(rows))
            out[dataset] = (task, rows)
        yield out, cfg, source
    shutil.rmtree(folder, ignore_errors=True)


def test_rows_map_to_plans_in_the_image(images):
    """Each row's plan opens the image its dataset names, with the repository there and the activation its eval
    script (SWE-bench) or its harness (SWE-rebench) runs, and nothing of the host."""
    tasks, cfg, source = images
    for dataset in DATASETS:
        plan = tasks[dataset][0].plan
        assert plan.source == dataset and plan.repo_dir == "" and plan.env_dir is None
        assert (Path(cfg.sif_dir) / plan.sif).is_dir()
        assert plan.activate[:3] == (
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
            "cd /testbed",
        )
        assert plan.sandbox_spec().setup == plan.activate
        assert plan.test_files == tuple(source.extra["test_files"])


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_sandbox_is_the_image_with_its_environment_active(images, dataset):
    """The agent's shell: /testbed is the image's repository at the base commit (a writable copy), its `python`
    the image's environment; read_file/write_file and the host-side diff work on it; no host files."""
    tasks, cfg, source = images
    task = tasks[dataset][0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
        sb = make_sandbox(task.plan.sandbox_spec(), cfg)
        sb.start()
        try:
            res = sb.exec("pwd; which python; python -c 'import sys; print(sys.prefix)'; git rev-parse HEAD")
            assert res.output.decode().split() == ["/testbed", f"{ENV}/bin/python", ENV, source.base_commit]
            assert sb.exec("id -u").output.decode().strip() != "0"
            assert (
                sb.exec(f"test -e {source.extra['repo_dir']}").exit_code != 0
            )  # the host's copy is not there
            first = source.patch.split("\n", 1)[0].split(" b/")[-1]
            before = sb.read_file(first)
            sb.write_file(first, before + b"# changed\n")
            assert sb.exec(f"tail -n1 {first}").output == b"# changed\n"
            assert "+# changed" in sb.exec("git diff").output.decode()
            assert "+# changed" in sb.host_patch(1 << 20)
            sb.exec("echo x > /testbed/new_file.txt")
        finally:
            sb.stop()
        sb = make_sandbox(task.plan.sandbox_spec(), cfg)  # the next sandbox starts from the image again
        sb.start()
        try:
            assert sb.exec("git status --porcelain").output == b""
        finally:
            sb.stop()


@pytest.mark.parametrize("dataset", DATASETS)
def test_grading_in_the_image_gold_resolves_and_hacks_do_not(images, dataset, tmp_path):
    """swebench's parser and grading on the image's test run, with the factory tasks' protections: the gold patch
    resolves; no patch, a conftest.py that rewrites outcomes (sanitiser), an edit of the test file (restored) and a
    runner rewrite in the library (canaries) do not."""
    tasks, cfg, source = images
    task = tasks[dataset][0]
    test_file = source.extra["test_files"][0]
    module = source.patch.split("\n", 1)[0].split(" b/")[-1]
    text = subprocess.run(
        ["git", "-C", source.extra["repo_dir"], "show", f"HEAD:{module}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    harmless = diff((module, text, text + "# harmless\n"))  # so that each hack is more than what is dropped
    patches = {
        "gold": task.patch,
        "empty": "",
        "conftest": harmless + diff(("conftest.py", None, REWRITE_HOOK)),
        "edit_tests": harmless + diff((test_file, None, "def test_nothing():\n    pass\n")),
        "runner": diff((module, text, RUNNER_ATTACKS["runtest_noop"] + text)),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
        jobs = [(task, p, tmp_path / name) for name, p in patches.items()]
        results = dict(
            zip(patches, grade_many(jobs, lambda spec: make_sandbox(spec, cfg), workers=2, skip_empty=False))
        )
    got = {name: (r.status, r.reason) for name, r in results.items()}
    assert results["gold"].status == RESOLVED, got
    assert all(results[n].status == UNRESOLVED for n in patches if n != "gold"), got
    assert results["conftest"].dropped and results["edit_tests"].dropped and results["runner"].tampered, got
