"""Run-directory commits and config checks, eval statistics and the Table-1 form (fast, no processes)."""

from __future__ import annotations

import json

import pytest

from swe_megatron.errors import UsageError
from swe_megatron.pipeline.eval import (
    PLAIN_NAME,
    check_model_name,
    eval_report,
    model_name,
    table,
    write_predictions,
)
from swe_megatron.pipeline.run_dir import RunDir, resume_conflicts
from swe_megatron.pipeline.warm_start import shortest_unique_replace
from swe_megatron.trajectory import ExitReason, Trajectory


def test_commit_is_one_atomic_state_write_and_prunes_old_checkpoints(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "checkpoints" / "a").mkdir(parents=True)
    run.pool_path.write_text("{}")
    run.commit("init", {"unit": "init", "path": "checkpoints/a", "stage": None}, train_step=False)
    run.checkpoint_dir("b").mkdir()
    run.commit("stage1:0", {"unit": "stage1:0", "path": "checkpoints/b", "stage": "stage1"})
    again = RunDir(tmp_path)
    assert again.state["done"] == ["init", "stage1:0"] and again.step == 1
    assert not (tmp_path / "checkpoints" / "a").exists() and (tmp_path / "checkpoints" / "b").exists()
    run.pool_path.write_text('{"uncommitted": 1}')
    again.restore_pool()
    assert json.loads(run.pool_path.read_text()) == {}


def test_keep_last_keeps_the_last_n_checkpoints_across_resumes(tmp_path):
    """checkpoint.keep_last=2: after each commit the two newest checkpoints exist, older ones are gone, also when
    the run directory is reopened between commits (the kept list is in state.json)."""
    units = ["init", "rft:0", "rft:1", "stage1:0", "eval"]
    for i, unit in enumerate(units):
        run = RunDir(tmp_path, keep_last=2)
        ckpt = None
        if unit != "eval":  # eval commits no checkpoint and keeps what is there
            d = run.checkpoint_dir(unit)
            d.mkdir()
            ckpt = {"unit": unit, "path": str(d.relative_to(tmp_path)), "stage": None}
        run.commit(unit, ckpt, train_step=i > 0)
        made = [u.replace(":", "-") for u in units[: min(i + 1, 4)]]
        assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(made[-2:]), unit
    assert RunDir(tmp_path).state["checkpoints"] == ["checkpoints/rft-1", "checkpoints/stage1-0"]


def test_resume_conflicts_name_the_keys():
    old = {
        "model": {"name": "a"},
        "seed": 0,
        "schedule": ["rft"],
        "tasks": {"train_file": "t"},
        "rft": {"samples_per_task": 2},
    }
    new = json.loads(json.dumps(old))
    assert resume_conflicts(old, new, ["rft"]) == []
    new["seed"], new["rft"]["samples_per_task"] = 1, 3
    assert resume_conflicts(old, new, ["rft"]) == ["seed: 0 -> 1", "rft.samples_per_task: 2 -> 3"]
    assert resume_conflicts(old, new, []) == ["seed: 0 -> 1"]
    new["model"] = {"name": "a", "hidden_size": 128}
    old["model"]["hidden_size"] = 64
    assert resume_conflicts(old, new, []) == ["model.hidden_size: 64 -> 128", "seed: 0 -> 1"]  # not the dicts


def test_a_stage_a_later_stage_followed_keeps_its_iterations():
    """More stage-1 iterations on a run already in stage 2 would train stage 1 again after stage 2 (and after its
    eval); growing the stage the run is in, or one not yet started, is a plain extension."""
    old = {
        "schedule": ["rft", "stage1", "stage2", "eval"],
        "stage1": {"iterations": 4},
        "stage2": {"iterations": 2},
    }
    new = json.loads(json.dumps(old))
    new["stage1"]["iterations"], new["stage2"]["iterations"] = 5, 3
    assert resume_conflicts(old, new, ["init", "rft", "stage1"]) == []
    assert resume_conflicts(old, new, ["init", "rft", "stage1", "stage2"]) == ["stage1.iterations: 4 -> 5"]
    assert resume_conflicts(old, new, ["rft", "stage1", "stage2", "eval"]) == [
        "stage1.iterations: 4 -> 5", "stage2.iterations: 2 -> 3"]  # fmt: skip


def _t(task, k, resolved, infra=False):
    return Trajectory(
        task,
        k,
        resolved=resolved,
        reward=float(resolved),
        patch="p" if resolved else "",
        exit_reason=ExitReason.engine_error if infra else ExitReason.submitted,
    )


def test_eval_report_table_and_predictions(tmp_path):
    trajs = [
        _t("a", 0, True),
        _t("a", 1, False),
        _t("b", 0, False),
        _t("b", 1, False),
        _t("c", 0, True),
        _t("c", 1, True, infra=True),
    ]
    rep = eval_report(trajs, [1, 2], "m")
    assert rep["tasks_scored"] == 2 and rep["tasks_left_out_infra"] == 1
    assert rep["pass@1"] == pytest.approx(25.0) and rep["pass@1_sem"] == pytest.approx(25.0)
    assert rep["pass@2"] == pytest.approx(50.0)
    assert "| m | 25.0 +- 25.00 | 50.0 |" in table(rep, [1, 2])
    first = write_predictions(trajs, "m", tmp_path)
    rows = [json.loads(x) for x in first.read_text().splitlines()]
    assert rows[0] == {"instance_id": "a", "model_name_or_path": "m", "model_patch": "p"} and len(rows) == 3


def test_shortest_unique_replace():
    src = "def f(x):\n    return x < 1\n\ndef g(y):\n    return y < 1\n"
    search, repl = shortest_unique_replace(src, "    return x < 1", "    return x <= 1")
    assert src.count(search) == 1 and len(search) <= 5
    assert src.replace(search, repl) == src.replace("return x < 1", "return x <= 1")
    assert shortest_unique_replace("a\na\n", "a", "b") is None


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        (None, "not a folder"),  # run_dir is a regular file
        ("{broken", "cannot be read"),
        ("[]", "state.json"),
        ('{"format": 1, "done": "stage1:0", "checkpoint": null, "step": 0}', "done"),
        ('{"format": 1, "done": [], "checkpoint": 5, "step": 0}', "checkpoint"),
        ('{"format": 1, "done": [], "checkpoint": {"unit": "x"}, "step": 0}', "checkpoint"),
        ('{"format": 1, "done": [], "checkpoint": null, "step": "2"}', "step"),
        ('{"format": 9, "done": [], "checkpoint": null, "step": 0}', "format"),
        ('{"done": [], "checkpoint": null}', "step"),
    ],
)
def test_run_refuses_a_damaged_run_dir_with_one_line_writing_nothing(tmp_path, capsys, state, needle):
    """A run_dir that is a file, or a state.json of the wrong shape, printed a 35-line traceback and wrote
    config.yaml into the damaged folder."""
    from swe_megatron.cli import main

    if state is None:
        run_dir = tmp_path / "run"
        run_dir.write_text("a file\n")
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "state.json").write_text(state)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["run", "embedded", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(run_dir) in err and needle in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("entries", "refused"),
    [
        (["notes.txt", "src/"], True),  # someone's project
        (["logs/", "notes.txt"], True),
        ([], False),  # empty: a new run
        (["jobs/", "slurm/", "STOP"], False),  # the launcher's folders before the trainer's first start
        (["driver.lock", "logs/"], False),  # a first start stopped before it wrote its config
        (["config.yaml", "notes.txt"], False),  # a run (the user's notes beside it stay theirs)
    ],
)
def test_run_refuses_a_folder_that_is_not_a_run_with_one_line_writing_nothing(
    tmp_path, capsys, entries, refused
):
    """Issue 42 item 4: `run ... run_dir=X` on a non-empty folder that is not a run wrote into it (and a run wipes
    parts of its folder); rollout and eval already refuse a non-empty --out."""
    from swe_megatron.pipeline.run_dir import RunDir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for e in entries:
        (run_dir / e.rstrip("/")).mkdir() if e.endswith("/") else (run_dir / e).write_text("x")
    if not refused:
        RunDir(run_dir).check_is_run()
        return
    from swe_megatron.cli import main

    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["run", "embedded", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"swe-megatron run: error: run_dir={run_dir} already holds files that are not a run's (notes.txt"
        f"{', src' if 'src/' in entries else ''}); give a new or empty folder, or an existing run's run_dir=...\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_failed_state_write_keeps_the_committed_checkpoint(tmp_path, monkeypatch):
    """The previous checkpoint is pruned only after state.json names the new one: a state write that fails
    (here: the disk refuses the rename) leaves the committed state and its checkpoint intact."""
    from swe_megatron import atomic_write

    run = RunDir(tmp_path)
    run.checkpoint_dir("a").mkdir()
    run.commit("stage1:0", {"unit": "stage1:0", "path": "checkpoints/a", "stage": "stage1"})
    run.checkpoint_dir("b").mkdir()

    def refuse(src, dst):
        raise OSError("read-only file system")

    monkeypatch.setattr(atomic_write.os, "replace", refuse)
    with pytest.raises(OSError):
        run.commit("stage1:1", {"unit": "stage1:1", "path": "checkpoints/b", "stage": "stage1"})
    monkeypatch.undo()
    again = RunDir(tmp_path)
    assert again.checkpoint["path"] == "checkpoints/a" and again.state["done"] == ["stage1:0"]
    assert (tmp_path / "checkpoints" / "a").is_dir()


def test_a_redone_unit_starts_from_an_empty_folder(tmp_path):
    """A unit redone after a crash must not see the uncommitted attempt's trajectories (counted twice)."""
    run = RunDir(tmp_path)
    (run.unit_dir("stage1:1") / "trajectories.jsonl").write_text("stale\n")
    assert (run.unit_dir("stage1:1") / "trajectories.jsonl").exists()  # reading a unit keeps its files
    assert list(run.unit_dir("stage1:1", fresh=True).iterdir()) == []


def test_the_live_pool_resumes_and_refuses_other_tasks_a_seed_change_or_a_damaged_file(tmp_path):
    run = RunDir(tmp_path)
    pool = run.open_pool(["a", "b", "c"], seed=0)
    assert run.pool_path.exists()  # a new pool is saved at once
    pool.start_stage("stage1")
    tasks = pool.sample(2, 0)
    run.save_pool(pool)
    again = RunDir(tmp_path).open_pool(["c", "b", "a"], seed=0)  # a restart: same tasks in any order
    assert again.to_dict() == pool.to_dict() and again.sample(2, 0) == tasks
    assert [p.name for p in tmp_path.iterdir()] == ["pool.json"]  # no temporary file left
    with pytest.raises(UsageError, match="seed 0 and 3 tasks, but this run has seed 1 and 3 tasks"):
        run.open_pool(["a", "b", "c"], seed=1)
    with pytest.raises(UsageError, match="2 tasks"):
        run.open_pool(["a", "b"], seed=0)
    run.pool_path.write_text("{not json")
    with pytest.raises(UsageError, match="pool.json cannot be read .*delete it"):
        run.open_pool(["a", "b", "c"], seed=0)


def test_a_crash_while_saving_the_pool_leaves_the_previous_file(tmp_path, monkeypatch):
    from swe_megatron import atomic_write

    run = RunDir(tmp_path)
    pool = run.open_pool(["a", "b", "c"], seed=0)
    pool.start_stage("stage1")
    run.save_pool(pool)
    before = run.pool_path.read_text()
    pool.sample(2, 0)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_write.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        run.save_pool(pool)
    monkeypatch.undo()
    assert run.pool_path.read_text() == before
    assert run.open_pool(["a", "b", "c"], seed=0).to_dict()["samples"] == []


def test_prediction_model_names_are_plain_identifiers():
    """What the pipeline and `eval` name their predictions: no spaces, parentheses or colons (they become folders
    of SWE-bench's log paths); a name given by hand is checked the same way."""
    assert model_name("tiny-qwen2", "embedded", "stage2:1") == "tiny-qwen2__embedded__stage2-1"
    assert model_name("Qwen/Qwen2.5-7B", "paper 7b", "(x)") == "Qwen-Qwen2.5-7B__paper-7b__x"
    for name in ["tiny-qwen2__embedded__stage2-1", "org/model-1.5"]:
        assert check_model_name(name) == name and PLAIN_NAME.fullmatch(model_name(name))
    for bad in ["tiny-qwen2 (embedded, after stage2:1)", "a/b/c", "../x", "", "a:b"]:
        with pytest.raises(UsageError, match="model name"):
            check_model_name(bad)


def test_a_resumed_run_says_after_which_unit(tmp_path):
    """Issue 42 item 10: a rerun that picks up committed units says so (it printed nothing)."""
    from swe_megatron.pipeline.driver import resume_line

    assert resume_line(tmp_path, []) is None
    assert resume_line(tmp_path, ["init", "rft:warm_start", "rft:0"]) == (
        f"run: resuming {tmp_path} after rft:0 (3 unit(s) committed)"
    )
