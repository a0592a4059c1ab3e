"""Replay a run's warm start without servers: the same scripted demonstrations, the same trainer, other seeds.

The warm start (pipeline/stages.py warm_start_sft) is deterministic on CPU for a seed: the scripted policy plays
the same turns and the SFT is one process. Its outcome, though, is not robust in the seed (issue 38: 60 epochs at
lr 3e-3 ended at loss 0.134 for seed 0 and 0.03 for others). This replays only the SFT, in one process, from
the demonstrations a run recorded (RUN/units/rft-warm_start/trajectories.jsonl), with the random init of a seed
as the `init` unit makes it, and prints the loss per epoch and where the loss target is reached:

    .venv/bin/python tools/warm_start_replay.py RUN_DIR --seeds 0 1 2 [key=value overrides of the run's config]

e.g. `rft.warm_start_loss_target=0` for the old fixed-epoch behaviour. The guard in the test suite
(tests/pipeline/test_warm_start_guard.py) runs the same replay on demonstrations shipped with the tests.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def demonstrations(path: Path) -> list:
    """The scripted warm start's trajectories (a trajectories.jsonl, gzipped or not)."""
    from swe_megatron.trajectory import Trajectory

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        trajs = [Trajectory.from_json(line) for line in f if line.strip()]
    # The file is in completion order; the warm start takes them in (task, sample) order (Rollouts.run).
    return sorted(trajs, key=lambda t: (t.task_id, t.sample_index))


def replay(cfg, trajs: list, seed: int, say=None) -> tuple[list[dict], list[float], dict[str, float]]:
    """The warm start of `cfg` (its rft stage) at `seed` on the trajectories: a world of one rank, the seed's
    random init, warm_start_sft. Returns (metrics per optimiser step, loss per epoch, gold_exactness per task)."""
    from swe_megatron.algo import num_optimizer_steps
    from swe_megatron.pipeline import spmd
    from swe_megatron.pipeline.stages import to_samples, warm_start_sft
    from swe_megatron.pipeline.warm_start import sft_data
    from swe_megatron.train.step import Trainer

    stage = cfg.rft
    kept, masks, _ = sft_data(trajs, stage.max_kept_per_task)
    samples = to_samples(kept, masks, [0.0] * len(kept))
    per_epoch = num_optimizer_steps(
        len(kept), stage.batch_size, stage.min_optimizer_steps, stage.max_optimizer_steps
    )
    epochs = stage.warm_start_epochs + stage.warm_start_anneal_epochs
    with spmd.start(cfg.parallel, seed):
        # The init unit's weights: a seeded random init (no hf_path); the warm start loads them with a fresh
        # optimiser, as here.
        trainer = Trainer(cfg.model, cfg.parallel, stage.optim, max(per_epoch * epochs, 1))
        steps, losses = warm_start_sft(trainer, stage, samples, seed, say)
        return steps, losses, gold_exactness(kept, samples, trainer.sample_logprobs(samples))


def gold_exactness(kept: list, samples: list, logprobs: list) -> dict[str, float]:
    """Per task: how exactly the policy writes its scripted solution once it has chosen to fix rather than give up,
    the probability of every action token of the solution but the one where it parts from the task's give-up
    (exp of minus their summed NLL; sampling at temperature 1 reproduces the commands this often). kept, samples,
    logprobs: the warm start's demonstrations, their TrainSamples and action-token logprobs, in one order."""
    actions = [s.tokens[s.action_mask] for s in samples]
    give_ups = {t.task_id: a for t, a in zip(kept, actions) if not t.resolved}
    out = {}
    for t, a, lp in zip(kept, actions, logprobs):
        if not t.resolved:
            continue
        other = give_ups.get(t.task_id)  # none: every token counts
        parts = (
            None
            if other is None
            else next((i for i in range(len(a)) if i >= len(other) or a[i] != other[i]), None)
        )
        nll = -lp.double()
        out[t.task_id] = math.exp(-(float(nll.sum()) - (float(nll[parts]) if parts is not None else 0.0)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Replay the warm start of RUN_DIR at each seed; print the epochs, the final loss and the loss curve."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="a run folder whose rft:warm_start unit is committed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--demos", type=Path, help="the demonstrations (default RUN_DIR/units/rft-warm_start/...)")
    argv = sys.argv[1:] if argv is None else argv
    # key=value overrides may come anywhere, after --seeds too (whose nargs would otherwise swallow them)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = p.parse_args([a for a in argv if a not in overrides])
    from swe_megatron.config.load import load_config

    cfg = load_config(str(args.run_dir / "config.yaml"), overrides)
    trajs = demonstrations(args.demos or args.run_dir / "units" / "rft-warm_start" / "trajectories.jsonl")
    torch_threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{len(trajs)} demonstrations, OMP_NUM_THREADS={torch_threads}; rft: epochs <= {cfg.rft.warm_start_epochs}, "
          f"loss target {cfg.rft.warm_start_loss_target}, lr {cfg.rft.warm_start_lr}", flush=True)  # fmt: skip
    for seed in args.seeds:
        t0 = time.monotonic()
        steps, losses, exact = replay(
            cfg, trajs, seed, lambda line, s=seed: print(f"seed {s}: {line}", flush=True)
        )
        curve = " ".join(f"{x:.3f}" for x in losses)
        per_task = " ".join(f"{k.split('__')[-1]} {v:.2f}" for k, v in sorted(exact.items()))
        print(f"seed {seed}: gold exactness mean {sum(exact.values()) / len(exact):.3f}, min {min(exact.values()):.3f} "
              f"({per_task})", flush=True)  # fmt: skip
        print(f"seed {seed}: {len(losses)} epochs, last epoch {losses[-1]:.4f}, last step {steps[-1]['loss']:.4f} "
              f"({time.monotonic() - t0:.0f} s); per epoch: {curve}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
