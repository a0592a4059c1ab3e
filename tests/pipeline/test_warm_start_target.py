"""The warm start trains to a loss target (issue 38): it stops after the first epoch whose mean loss per action token
is at most rft.warm_start_loss_target, never runs more than rft.warm_start_epochs, and says so when the target was
not reached. The trainer here is a stand-in that reports scripted losses (the real one: test_warm_start_guard.py)."""

from __future__ import annotations

import pytest

from swe_megatron.config.schema import LrSchedule, StageConfig
from swe_megatron.pipeline.stages import epoch_loss, warm_start_sft
from swe_megatron.train.optim import LrScheduler


class ScriptedLosses:
    """Trainer stand-in: update() returns the next epoch's loss for every step (action tokens = samples) and the lr
    of the schedule it follows at its step count, as the real one does."""

    def __init__(self, per_epoch: list[float], steps_per_epoch: int):
        self.per_epoch, self.steps, self.steps_done = list(per_epoch), steps_per_epoch, 0
        self.schedule = LrScheduler(1.0, 1.0, 0, LrSchedule.constant, 1)

    def set_schedule(self, schedule):
        self.schedule = schedule

    def update(self, samples, num_steps, loss):
        epoch = self.steps_done // self.steps
        lr = self.schedule.lr_at(self.steps_done)
        self.steps_done += 1
        return [{"loss": self.per_epoch[epoch], "action_tokens": float(len(samples)), "lr": lr}]


def _stage(target: float, most: int, anneal: int = 0) -> StageConfig:
    return StageConfig(batch_size=2, min_optimizer_steps=1, max_optimizer_steps=0, warm_start_epochs=most,
                       warm_start_loss_target=target, warm_start_lr=0.5, warm_start_anneal_epochs=anneal)  # fmt: skip


def test_stops_at_the_first_epoch_at_or_under_the_target():
    # binary fractions: the epoch's token-weighted mean is exact
    trainer, said = ScriptedLosses([3.0, 0.5, 0.25, 0.125, 0.0625, 0.0625], steps_per_epoch=3), []
    steps, losses = warm_start_sft(trainer, _stage(0.125, 6), list(range(6)), seed=0, say=said.append)
    assert losses == [3.0, 0.5, 0.25, 0.125] and len(steps) == 4 * 3
    assert said[-1] == "epoch 4/6, loss 0.1250 (target 0.125)"


def test_the_anneal_runs_after_the_target_with_the_lr_falling_from_the_warm_start_lr_to_near_0():
    trainer, said = ScriptedLosses([3.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 9.0], steps_per_epoch=3), []
    steps, losses = warm_start_sft(trainer, _stage(0.5, 6, anneal=2), list(range(6)), seed=0, say=said.append)
    assert losses == [3.0, 0.5, 0.25, 0.125] and len(steps) == 4 * 3
    lrs = [s["lr"] for s in steps]
    assert lrs[:6] == [0.5] * 6  # the target's epochs at the warm start's constant lr
    assert lrs[6] == 0.5 and all(a > b for a, b in zip(lrs[6:], lrs[7:])) and 0 < lrs[-1] < 0.05, lrs
    assert said[-1] == "anneal: 2 epochs to lr 0, loss 0.5000 -> 0.1250"


def test_no_anneal_leaves_the_lr_constant():
    trainer = ScriptedLosses([3.0, 0.5, 0.25], steps_per_epoch=3)
    steps, losses = warm_start_sft(trainer, _stage(0.5, 6), list(range(6)), seed=0)
    assert losses == [3.0, 0.5] and {s["lr"] for s in steps} == {0.5}


def test_runs_at_most_warm_start_epochs_and_warns_when_the_target_is_missed():
    trainer, said = ScriptedLosses([3.0, 0.5, 0.25], steps_per_epoch=3), []
    _, losses = warm_start_sft(trainer, _stage(0.05, 3), list(range(6)), seed=0, say=said.append)
    assert losses == [3.0, 0.5, 0.25]
    assert said[-1].startswith(
        "WARNING: the loss 0.2500 is above rft.warm_start_loss_target=0.05 after 3 epochs"
    )


def test_no_target_runs_every_epoch_quietly_but_the_last_line():
    trainer, said = ScriptedLosses([3.0, 0.0, 0.0], steps_per_epoch=3), []
    _, losses = warm_start_sft(trainer, _stage(0.0, 3), list(range(6)), seed=0, say=said.append)
    # a loss of exactly 0 meets a 0 target: with no target the loop still stops there (nothing left to learn)
    assert losses == [3.0, 0.0] and not any(s.startswith("WARNING") for s in said)


def test_epoch_loss_weighs_steps_by_their_action_tokens():
    assert epoch_loss([{"loss": 1.0, "action_tokens": 30.0}, {"loss": 0.0, "action_tokens": 10.0}]) == 0.75
    assert epoch_loss([]) != epoch_loss([])  # nan: no tokens, no loss
    with pytest.raises(KeyError):
        epoch_loss([{"loss": 1.0}])


def test_gold_exactness_leaves_out_only_the_token_where_a_solution_parts_from_its_give_up():
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from warm_start_replay import gold_exactness

    from swe_megatron.train.packing import TrainSample

    def sample(tokens):  # token 0 is the prompt; every later token acts
        mask = torch.ones(len(tokens), dtype=torch.bool)
        mask[0] = False
        return TrainSample(torch.tensor(tokens), mask)

    kept = [SimpleNamespace(task_id="a", resolved=True), SimpleNamespace(task_id="a", resolved=False),
            SimpleNamespace(task_id="b", resolved=True)]  # fmt: skip
    samples = [sample([9, 1, 2, 3, 4]), sample([9, 1, 5]), sample([9, 7, 8])]
    logprobs = [
        torch.log(torch.tensor([0.9, 0.5, 0.8, 0.7])),
        torch.zeros(2),
        torch.log(torch.tensor([0.6, 0.5])),
    ]
    exact = gold_exactness(kept, samples, logprobs)
    assert set(exact) == {"a", "b"}  # solutions only
    assert exact["a"] == pytest.approx(
        0.9 * 0.8 * 0.7
    )  # token 2 (the decision: 2 vs the give-up's 5) left out
    assert exact["b"] == pytest.approx(0.6 * 0.5)  # no give-up to part from: every token counts
