"""Train-step tokens/s on CPU: the Megatron-Core trainer vs a plain transformers step of the same model.

Figures in docs/benchmarks.md ("Trainer"). Usage, from the repo root:

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_train_step.py [--trajectories 8 --length 512 --steps 4]

Both sides start from the same weights (the embedded tiny-qwen2 shape, real 151,936 vocabulary; built
with transformers and loaded into the trainer), train on the same trajectories packed into the same
micro-batches (`ParallelConfig.micro_batch_tokens`), with the same loss (SFT: summed NLL of action
tokens / action-token count), AdamW and grad clipping, one optimiser step per iteration. They run in one
process, alternating step by step, so both see the same machine load; the median step time is reported.

- trainer: `Trainer.train_step` (Megatron-Core GPTModel, local spec, gloo world of 1, action-only
  logprobs: no [tokens x vocab] logits);
- transformers: `Qwen2ForCausalLM(input_ids).logits` -> log_softmax -> gather at action tokens ->
  backward per micro-batch, then `torch.optim.AdamW.step()`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _batch(n: int, length: int, vocab: int, seed: int = 0):
    from swe_megatron.train.packing import TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        mask = torch.rand(length, generator=g) < 0.5
        mask[0] = False
        out.append(TrainSample(torch.randint(0, vocab, (length,), generator=g), mask))
    return out


def _hf_step(model, opt, microbatches, clip: float) -> float:
    opt.zero_grad(set_to_none=True)
    total = sum(mb.num_action_tokens for mb in microbatches)
    loss_sum = 0.0
    for mb in microbatches:
        logits = model(input_ids=mb.tokens).logits  # [b, s, vocab]
        logp = torch.log_softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1])
        lp = logp.index_select(0, mb.rows).gather(-1, mb.targets[:, None])[:, 0]
        loss = -lp.sum() / total
        loss.backward()
        loss_sum += float(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss_sum


def megatron_trainer(preset: str, micro_batch_tokens: int, total_steps: int):
    """(model config, transformers model, optimiser config, Trainer): the preset's shape built with transformers
    and loaded into a Megatron-Core Trainer (a gloo world of 1, this process); same weights on both sides."""
    from swe_megatron.config.schema import OptimConfig, ParallelConfig
    from swe_megatron.model.tiny import tiny_qwen2
    from swe_megatron.train import parallel
    from swe_megatron.train.command import load_model_preset
    from swe_megatron.train.step import Trainer

    cfg = load_model_preset(preset)
    hf = tiny_qwen2(cfg, seed=0).train()
    optim = OptimConfig(lr=1e-4, weight_decay=0.1, grad_clip=1.0)
    par = ParallelConfig(micro_batch_tokens=micro_batch_tokens)
    parallel.init_distributed(0, 1, master_port=parallel.free_port())
    parallel.init_model_parallel(par, seed=0)
    return cfg, hf, optim, Trainer(cfg, par, optim, total_steps=total_steps, hf_state=hf.state_dict())


def sft_microbatches(vocab: int, trajectories: int, length: int, micro_batch_tokens: int):
    """Random trajectories (half their tokens actions) packed into micro-batches, and their token count."""
    from swe_megatron.train.packing import pack

    samples = _batch(trajectories, length, vocab)
    return pack(samples, micro_batch_tokens), sum(s.tokens.numel() for s in samples)


def main(argv: list[str] | None = None) -> None:
    """Run both steps alternately and print one JSON line with tokens/s and the ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=8)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--micro-batch-tokens", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4, help="timed steps per side (after one warm-up step each)")
    p.add_argument("--preset", default="tiny-qwen2", help="model preset (shape only)")
    a = p.parse_args(argv)
    from swe_megatron.train import parallel
    from swe_megatron.train.step import LossSpec

    cfg, hf, optim, trainer = megatron_trainer(a.preset, a.micro_batch_tokens, a.steps + 1)
    opt = torch.optim.AdamW(
        hf.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=0.1
    )

    mbs, tokens = sft_microbatches(cfg.vocab_size, a.trajectories, a.length, a.micro_batch_tokens)
    times: dict[str, list[float]] = {"trainer": [], "transformers": []}
    losses = {}
    for step in range(a.steps + 1):
        for side in ("trainer", "transformers"):
            start = time.perf_counter()
            if side == "trainer":
                losses[side] = trainer.train_step(mbs, LossSpec("sft"))["loss"]
            else:
                losses[side] = _hf_step(hf, opt, mbs, optim.grad_clip)
            if step:  # the first step of each side is a warm-up
                times[side].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "model": cfg.name,
                "params_m": round(sum(p.numel() for p in hf.parameters()) / 1e6, 2),
                "tokens_per_step": tokens,
                "micro_batches": len(mbs),
                "threads": torch.get_num_threads(),
                "trainer_tokens_per_s": round(tokens / med["trainer"], 1),
                "transformers_tokens_per_s": round(tokens / med["transformers"], 1),
                "ratio_trainer_over_transformers": round(med["transformers"] / med["trainer"], 2),
                "step_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
                "last_loss": {k: round(v, 4) for k, v in losses.items()},
            }
        )
    )
    parallel.destroy()


if __name__ == "__main__":
    main()
