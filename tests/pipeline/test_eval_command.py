"""`swe-megatron eval`: its pass@k follow --runs, its model name is the run's eval unit's, and a rerun into the
default folder is refused naming what the user can do (issue 42 item 7)."""

from __future__ import annotations

import json

from swe_megatron.cli import main
from swe_megatron.config.load import load_config
from swe_megatron.pipeline.eval import checkpoint_model_name, command_ks, eval_report, model_name
from swe_megatron.trajectory import Trajectory


def test_pass_at_k_follows_runs():
    assert command_ks(10) == [1, 10]  # not embedded's eval.k [1, 3]: pass@10 over 10 runs, as the paper
    assert command_ks(1) == [1]
    trajs = [Trajectory(task_id="t", sample_index=i, resolved=i == 9) for i in range(10)]
    report = eval_report(trajs, command_ks(10), "m")
    assert "pass@10" in report and "pass@3" not in report


def test_model_name_is_the_run_eval_units(tmp_path):
    cfg = load_config("embedded", [])
    hf = tmp_path / "runs" / "embedded" / "checkpoints" / "stage2-1" / "hf"
    hf.mkdir(parents=True)
    # stages._evaluate: model_name(cfg.model.name, cfg.name, the last committed unit)
    assert checkpoint_model_name(cfg, hf) == model_name(cfg.model.name, cfg.name, "stage2:1")
    assert checkpoint_model_name(cfg, hf.parent) == model_name(cfg.model.name, cfg.name, "stage2:1")


def test_rerun_without_out_names_what_the_user_can_do(tmp_path, capsys):
    ckpt = tmp_path / "stage2-1"
    (ckpt / "hf").mkdir(parents=True)
    (ckpt / "hf" / "config.json").write_text("{}")
    (ckpt / "eval").mkdir()
    (ckpt / "eval" / "report.json").write_text("{}")  # the first eval's
    tasks = tmp_path / "tasks.jsonl"
    row = {"instance_id": "lib__x-1", "repo": "lib/x", "base_commit": "0" * 40, "patch": "",
           "problem_statement": "p", "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [],
           "repo_dir": str(tmp_path), "test_cmd": "pytest"}  # fmt: skip
    tasks.write_text(json.dumps(row) + "\n")
    assert main(["eval", "embedded", "--checkpoint", str(ckpt), "--tasks", str(tasks), "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--out " + str(ckpt) not in err and "no --out given" in err and "give --out NEW_DIR" in err, err
    assert (ckpt / "eval" / "report.json").read_text() == "{}"
