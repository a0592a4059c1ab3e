"""Guard of what broke learning in issue 38: the embedded default's warm start must converge for every seed.

The README's run (seed 0) stopped learning in stage 1 because its warm start, a fixed 60 epochs at lr 3e-3, ended
at loss 0.134 where other seeds ended at ~0.03: the SFT's path is chaotic in the last bits of its arithmetic (a
kernel change, the thread count or the order of the demonstrations moves where epoch 60 lands), so a fixed epoch
count is a lottery over seeds. The warm start now trains to rft.warm_start_loss_target. This replays the embedded
default's warm start (tools/warm_start_replay.py: the real trainer, the scripted demonstrations a run recorded,
shipped in data/warm_start_demos.jsonl.gz) for several seeds and checks that each reaches the target within the
preset's epoch cap, and that the weights it ends with are not mid-spike. What it cannot do: reproduce the failure
itself. The chaotic end point of a fixed epoch count depends on the kernels and the thread count (the pipeline, at
two threads, ended seed 0 at 0.134; a one-thread replay of the same 60 epochs ends at 0.032-0.035), so a test
of the old rule would pass or fail by machine. The stopping rule itself is tested in test_warm_start_target.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import warm_start_replay  # noqa: E402

# ~3 min per seed of SFT on one idle core (335 s for two): tools/test.sh and CI run it, plain pytest does not
pytestmark = pytest.mark.e2e

DEMOS = Path(__file__).with_name("data") / "warm_start_demos.jsonl.gz"
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def embedded():
    from swe_megatron.config.load import load_config

    return load_config("embedded")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_embedded_warm_start_reaches_its_loss_target(embedded, seed):
    trajs = warm_start_replay.demonstrations(DEMOS)
    assert len(trajs) == 12 and sum(t.resolved for t in trajs) == 6  # 6 solutions + 6 give-ups, as the run played
    rft = embedded.rft
    steps, losses, exact = warm_start_replay.replay(embedded, trajs, seed)
    assert losses[-1] <= rft.warm_start_loss_target, (seed, len(losses), losses[-5:])
    assert len(losses) <= rft.warm_start_epochs + rft.warm_start_anneal_epochs
    # The anneal's purpose: once it chooses to fix, the policy writes the scripted commands exactly most of the
    # time (without it, at a constant lr: mean 0.74 and 0.73, min 0.43 and 0.57 for seeds 0 and 2; the garbled
    # `replace` texts capped RL's resolved rate near 62%, docs/learning.md).
    assert len(exact) == 6 and sum(exact.values()) / 6 >= 0.78 and min(exact.values()) >= 0.65, (seed, exact)
    # The loss a user sees is the converged one: the last step is near the epoch's mean, not a spike.
    assert steps[-1]["loss"] < 3 * rft.warm_start_loss_target, steps[-1]
