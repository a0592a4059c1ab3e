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
from task_image import ENV, build_image, grade_patches_in_images, rebench_row, swebench_row
from tiny_task import diff

from swe_megatron.config.schema import SandboxBackend, SandboxConfig
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
         if len(t.plan.test_files) == 1),
        None,
    )  # fmt: skip
    if source is None:
        pytest.skip("no factory task with one test file")
    folder = Path(tempfile.mkdtemp(prefix="swe-task-images-", dir="/var/tmp"))
    folder.chmod(0o755)
    sif_dir = folder / "sifs"
    sif_dir.mkdir(mode=0o755)
    cfg = replace(  # workspaces (and the image repositories read out) in the folder removed afterwards
        SandboxConfig(),
        backend=SandboxBackend.apptainer,
        sif_dir=str(sif_dir),
        workspace_root=str(folder / "workspaces"),
    )
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
        assert plan.test_files == source.plan.test_files


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
def test_grade_in_the_image_gold_resolves_and_hacks_do_not(images, dataset, tmp_path):
    """`swe-megatron grade` on the dataset's rows: swebench's parser and grading on the image's test run, with the
    factory tasks' protections. The gold patch resolves; no patch, a conftest.py that rewrites outcomes
    (sanitiser), an edit of the test file (dropped, and restored anyway) and a runner rewrite in the library
    (canaries) do not."""

    tasks, cfg, source = images
    row = json.loads(tasks[dataset][1].read_text())
    test_file = source.plan.test_files[0]
    module = source.patch.split("\n", 1)[0].split(" b/")[-1]
    text = subprocess.run(
        ["git", "-C", source.extra["repo_dir"], "show", f"HEAD:{module}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    harmless = diff((module, text, text + "# harmless\n"))  # so that each hack is more than what is dropped
    patches = {
        "gold": source.patch,
        "empty": "",
        "conftest": harmless + diff(("conftest.py", None, REWRITE_HOOK)),
        "edit_tests": harmless + diff((test_file, None, "def test_nothing():\n    pass\n")),
        "runner": diff((module, text, RUNNER_ATTACKS["runtest_noop"] + text)),
    }
    sandbox = [f"sandbox.sif_dir={cfg.sif_dir}", f"sandbox.workspace_root={cfg.workspace_root}"]
    report = grade_patches_in_images(row, patches, tmp_path, sandbox)
    name = report["name"]
    assert [name[i] for i in report["resolved_ids"]] == ["gold"], report
    assert sorted(name[i] for i in report["unresolved_ids"]) == ["conftest", "edit_tests", "runner"], report
    assert [name[i] for i in report["empty_patch_ids"]] == ["empty"] and report["error_ids"] == []
    assert [name[i] for i in report["tampered_ids"]] == ["runner"]
    dropped = {
        name[i]: [d["path"] for d in r["dropped"]] for i, r in report["instances"].items() if r.get("dropped")
    }
    assert dropped == {"conftest": ["conftest.py"], "edit_tests": [test_file]}


def test_rollout_in_the_image_runs_the_agent_in_the_task_environment(images, tmp_path):
    """A rollout of the SWE-bench row: the agent's commands run in the image's environment (`which python`), its
    gold edits made through the workspace are its submitted patch, graded resolved in the image."""
    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.config.schema import RunConfig
    from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
    from swe_megatron.model.tokenizer import load_tokenizer
    from swe_megatron.rollout.setup import Rollouts

    tasks, cfg, _ = images
    task = tasks["swebench"][0]
    chat = ChatFormat(load_tokenizer("qwen2.5"))
    run = RunConfig(run_dir=str(tmp_path / "run"), sandbox=replace(cfg, command_timeout_s=60))
    run.agent.concurrency = 1
    run.agent.provenance_workers = 0  # the provenance checks in this process
    run.monitor.progress = False
    probe = "Which Python runs here?\n```\nwhich python; python -c 'import sys; print(sys.prefix)'\n```"
    engine = ScriptedPolicy(chat, {task.instance_id: [probe, *gold_patch_script(task.patch)]})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")
        rollouts = Rollouts(run, engine, chat=chat)
        (traj,), stats = rollouts.run([task], 1, rollouts.limits(run.stage1), tmp_path / "out")
    assert traj.infra_failure is None, traj.infra_failure
    assert f"{ENV}/bin/python\n{ENV}" in traj.messages[3]["content"]
    assert traj.reward == 1.0 and traj.resolved and stats.resolved == 1


def test_eval_in_the_image_through_the_sandbox_server(images, tmp_path):
    """`eval`'s own path (pipeline.eval.evaluate, as `swe-megatron eval` and a run's eval unit call it, over the
    sandbox server a Topology starts, here on the apptainer backend) on the SWE-rebench row, one scripted agent per
    run: the agent's `python` is the image's; gold resolves; giving up, a conftest.py that rewrites outcomes, a
    test file made trivial and a runner rewrite in the library do not; nothing is left out as an infrastructure
    failure, and the table and predictions say so."""
    import base64

    from omegaconf import OmegaConf

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.config.load import load_config
    from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
    from swe_megatron.model.tokenizer import load_tokenizer
    from swe_megatron.pipeline.eval import command_ks, evaluate
    from swe_megatron.pipeline.topology import Topology
    from swe_megatron.rollout.setup import Rollouts

    tasks, cfg, source = images
    task = tasks["swe-rebench"][0]
    test_file = source.plan.test_files[0]
    module = source.patch.split("\n", 1)[0].split(" b/")[-1]

    def write(path: str, text: str, keep: bool = False) -> str:  # one shell line, no quoting of the text
        b64 = base64.b64encode(text.encode()).decode()
        tail = f"; cat {path}" if keep else ""
        return (
            f"I write {path}.\n```\n{{ echo {b64} | base64 -d{tail}; }} > /tmp/new && cp /tmp/new {path}\n```"
        )

    submit = "Done.\n```\nsubmit\n```"
    probe = "Which Python runs here?\n```\nwhich python; python -c 'import sys; print(sys.prefix)'\n```"
    scripts = {
        "gold": [probe, *gold_patch_script(task.patch)],
        "give_up": [submit],
        "conftest": [write("conftest.py", REWRITE_HOOK), submit],
        "edit_tests": [write(test_file, "def test_nothing():\n    pass\n"), submit],
        "runner": [write(module, RUNNER_ATTACKS["runtest_noop"], keep=True), submit],
    }
    names = list(scripts)
    run = load_config("embedded", [
        f"run_dir={tmp_path / 'run'}", "sandbox.backend=apptainer", f"sandbox.sif_dir={cfg.sif_dir}",
        f"sandbox.workspace_root={cfg.workspace_root}", "monitor.progress=false", "agent.provenance_workers=0",
        "sampling.max_tokens_per_turn=512",  # the hacks' base64 lines
    ])  # fmt: skip
    chat = ChatFormat(load_tokenizer(run.model.tokenizer))
    engine = ScriptedPolicy(chat, {f"{task.instance_id}/{i}": s for i, s in enumerate(scripts.values())})
    assert engine.problems(run.sampling.max_tokens_per_turn, run.eval.t_max) == {}
    out = tmp_path / "eval"
    config_file = tmp_path / "config.yaml"  # the sandbox server reads the run's config, as under `eval`
    config_file.write_text(OmegaConf.to_yaml(run))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE}{os.pathsep}{os.environ['PATH']}")  # the sandbox server's apptainer too
        with Topology(run, tmp_path / "topology", config_file) as topo:
            sandboxes = topo.start_sandbox_server()
            rollouts = Rollouts(run, engine, sandboxes, chat)
            report, text = evaluate(rollouts, [task], len(names), out, "scripted", command_ks(len(names)))
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    outcome = {names[t["sample_index"]]: (t["resolved"], t["infra_failure"]) for t in trajs}
    assert outcome == {n: (n == "gold", None) for n in names}, outcome
    gold = next(t for t in trajs if t["sample_index"] == 0)
    observation = gold["messages"][3]["content"]
    assert f"{ENV}/bin/python\n{ENV}" in observation, observation
    assert report["tasks_left_out_infra"] == 0 and report["pass@1"] == pytest.approx(100 / len(names)), report
    assert "| scripted | 20.0 +- 20.00 | 100.0 |" in text, text
    preds = [json.loads(x) for x in (out / "predictions-run0.jsonl").read_text().splitlines()]
    assert preds[0]["instance_id"] == task.instance_id and "+" in preds[0]["model_patch"]


def test_a_short_run_on_image_rows(images, tmp_path):
    """`swe-megatron run` on image rows (a tiny schedule: warm start, one RFT iteration, eval), its sandbox server
    on the apptainer backend (stand-in): trains on the SWE-bench row and evaluates on the SWE-rebench row. The warm
    start's scripted gold solution, played through the agent's commands in the image, resolves and its give-up
    does not; no episode of any unit is an infrastructure failure (the tiny model's own episodes included). Then
    `swe-megatron eval` on the run's checkpoint and the SWE-rebench row: two runs scored, none left out."""
    import sys

    tasks, cfg, _ = images
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "swe_megatron.cli", "run", "embedded", f"run_dir={run_dir}",
           f"tasks.train_file={tasks['swebench'][1]}", f"tasks.test_file={tasks['swe-rebench'][1]}",
           "schedule=[rft,eval]", "rft.warm_start_epochs=1", "rft.warm_start_anneal_epochs=1", "rft.iterations=1",
           "rft.tasks_per_iteration=1",
           "rft.samples_per_task=1", "rft.t_max=3", "rft.l_thr=2", "eval.runs=1", "eval.k=[1]", "eval.t_max=3",
           "sampling.max_tokens_per_turn=96", "engine.port=0", "monitor.progress=false",
           "sandbox.backend=apptainer", f"sandbox.sif_dir={cfg.sif_dir}",
           f"sandbox.workspace_root={cfg.workspace_root}"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{FAKE}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["done"] == ["init", "rft:warm_start", "rft:0", "eval"], state
    warm = json.loads((run_dir / "units" / "rft-warm_start" / "metrics.json").read_text())
    assert warm["warm_start"]["scripted_resolved"] == 1.0 and warm["warm_start"]["decoys_resolved"] == 0.0, (
        warm
    )
    for unit in ("rft-warm_start", "rft-0"):
        trajs = [
            json.loads(x) for x in (run_dir / "units" / unit / "trajectories.jsonl").read_text().splitlines()
        ]
        assert trajs and all(t["infra_failure"] is None for t in trajs), (unit, trajs)
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["tasks"] == report["tasks_scored"] == 1 and report["tasks_left_out_infra"] == 0, report

    # `swe-megatron eval` itself (its own vLLM server and sandbox server) on the run's checkpoint and the image row
    (ckpt,) = (run_dir / "checkpoints").iterdir()
    out_dir = tmp_path / "eval"
    cmd = [sys.executable, "-m", "swe_megatron.cli", "eval", "embedded", "--checkpoint", str(ckpt), "--tasks",
           str(tasks["swe-rebench"][1]), "--runs", "2", "--out", str(out_dir), "eval.t_max=3", "engine.port=0",
           "monitor.progress=false", "sandbox.backend=apptainer", f"sandbox.sif_dir={cfg.sif_dir}",
           f"sandbox.workspace_root={cfg.workspace_root}"]  # fmt: skip
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads((out_dir / "report.json").read_text())
    assert (report["runs"], report["tasks_scored"], report["tasks_left_out_infra"]) == (2, 1, 0), report
    assert "pass@2" in report and (out_dir / "table.md").exists()
    trajs = [json.loads(x) for x in (out_dir / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 and all(t["infra_failure"] is None for t in trajs), trajs
