"""What bounded-staleness async RL (algo.max_staleness=1) should buy: a phase-time model, checked against the
runs of tools/bench_async.py on this machine, then applied to the paper's cluster (16 x 8 H200, 8 trainer + 8
engine nodes).

    .venv/bin/python tools/async_model.py --bench docs/bench_async.json [--mfu 0.35 --decode-tok-s 25 ...]

The model. An RL iteration has phases R (rollouts: every episode, graded; the slowest sets it), U (the trainer's
update: old logprobs, optimiser steps), S (weight sync into the engines), C (checkpoint) and O (the rest:
batch building, logging, the commit). Synchronously they run one after the other: T_sync = R + U + S + C + O.
With k = 1 the rollouts of iteration i+1 start when the update on i starts, and pause for the sync (the engine
gate), so the period is the longer of the two sides: T_async = max(R + S, U + S + C) + O. The speed-up
T_sync / T_async is at most 2, reached when R = U + C: the side that waits, waits less. (Trainer and engines are
separate machines in the paper's 8 + 8 split; on this machine `taskset` gives each side its own core.)

Check: the sync runs' median phase times predict T_async; the async runs measure it.

Paper cluster (estimates; every assumption is a flag, printed with the result):
  U = tokens trained per iteration x FLOPs per token / (64 GPUs x peak x MFU), with tokens = episodes x kept
      fraction (dynamic sampling drops all-equal groups) x mean trajectory length T, and FLOPs per token =
      (6N + 6 L d T) x 4/3 (full recomputation) + (2N + 2 L d T) (the old-logprob pass); causal attention
      (scores and values, 4 d per attended position per layer) over T/2 positions on average gives 2 L d T.
  R = episodes x mean episode time / concurrent episodes + (longest - mean episode) (the straggler tail), with
      concurrent episodes = servers x episodes per server (KV-cache bound) and an episode = turns x (generated
      tokens per turn / decode speed per sequence + tool and prefill seconds per turn).
  S from `swe-megatron plan` (broadcast 72B: 2.9 s); C = the checkpoint (weights + Adam states, 16 bytes per
      parameter) at the filesystem's write bandwidth; O = 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PHASES = ("rollout_s", "train_s", "weight_sync_s", "checkpoint_s", "cycle_s")


def periods(r: float, u: float, s: float, c: float, o: float) -> tuple[float, float]:
    """(T_sync, T_async with k=1) of an iteration with these phase seconds."""
    return r + u + s + c + o, max(r + s, u + s + c) + o


def steady_medians(run: dict) -> dict[str, float]:
    """Median of each phase over a bench run's steady RL iterations (each stage's first left out)."""
    units = [u for u in run["units"] if u["steady"]]
    return {p: statistics.median(u[p] for u in units) for p in PHASES}


def check(bench: dict) -> None:
    """Per seed: T_async predicted from the sync run's phases vs measured in the async run (steady medians)."""
    print("| seed | sync R | U | S | C | O | T_sync measured | T_async predicted | T_async measured | "
          "speed-up predicted | measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = bench["runs"]
    for seed in sorted({r["seed"] for r in runs.values()}):
        s, a = runs.get(f"sync-s{seed}"), runs.get(f"async-s{seed}")
        if not (s and a):
            continue
        m, ma = steady_medians(s), steady_medians(a)
        r, u, w, c = m["rollout_s"], m["train_s"], m["weight_sync_s"], m["checkpoint_s"]
        o = max(0.0, m["cycle_s"] - (r + u + w + c))
        _, predicted = periods(r, u, w, c, o)
        print(f"| {seed} | {r:.1f} | {u:.1f} | {w:.1f} | {c:.1f} | {o:.1f} | {m['cycle_s']:.1f} | {predicted:.1f} | "
              f"{ma['cycle_s']:.1f} | {m['cycle_s'] / predicted:.2f} | {m['cycle_s'] / ma['cycle_s']:.2f} |")  # fmt: skip


def paper(a: argparse.Namespace) -> None:
    """The paper's two RL stages on 16 x 8 H200 (8 + 8), sync vs k = 1."""
    n, layers, d = 72.7e9, 80, 8192
    ckpt_s = 16 * n / (a.fs_write_gb_s * 1e9)
    print(f"\nassumptions: MFU {a.mfu}, peak {a.peak_tflops} TFLOP/s per GPU, 64 trainer GPUs; kept fraction "
          f"{a.kept}; decode {a.decode_tok_s} tok/s per sequence, {a.tokens_per_turn} generated tokens and "
          f"{a.tool_s} s of tool + prefill per turn; 16 engine servers (TP 4); checkpoint {ckpt_s:.0f} s "
          f"({a.fs_write_gb_s} GB/s); sync {a.sync_s} s (broadcast, `swe-megatron plan`)")  # fmt: skip
    print("\n| stage | episodes | mean turns (max) | mean tokens | episodes per server | R s | U s | T_sync s | "
          "T_async s | speed-up | R/(U+C) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    stages = (("stage 1 (65k)", 300 * 10, a.turns1, 40, a.tokens1, a.per_server1),
              ("stage 2 (131k)", 100 * 10, a.turns2, 80, a.tokens2, a.per_server2))  # fmt: skip
    for name, episodes, turns, t_max, ctx, per_server in stages:
        turn_s = a.tokens_per_turn / a.decode_tok_s + a.tool_s
        r = episodes * turns * turn_s / (16 * per_server) + (t_max - turns) * turn_s
        flops = (6 * n + 6 * layers * d * ctx) * 4 / 3 + (2 * n + 2 * layers * d * ctx)
        u = episodes * a.kept * ctx * flops / (64 * a.peak_tflops * 1e12 * a.mfu)
        t_sync, t_async = periods(r, u, a.sync_s, ckpt_s, 0.0)
        print(f"| {name} | {episodes} | {turns} ({t_max}) | {ctx / 1e3:.0f}k | {per_server} | {r:.0f} | {u:.0f} | "
              f"{t_sync:.0f} | {t_async:.0f} | {t_sync / t_async:.2f} | {r / (u + ckpt_s):.2f} |")  # fmt: skip
    print("\nspeed-up at other balances (same S and C as stage 1):")
    print("| R/(U+C) | " + " | ".join(f"{x:g}" for x in (0.25, 0.5, 1, 2, 4)) + " |")
    print("|---|" + "---|" * 5)
    base = 1000.0
    row = [periods(x * base, base - ckpt_s, a.sync_s, ckpt_s, 0.0) for x in (0.25, 0.5, 1, 2, 4)]
    print("| speed-up | " + " | ".join(f"{t_s / t_a:.2f}" for t_s, t_a in row) + " |")


def main() -> None:
    """Check the model on the bench runs (if given), then apply it to the paper's cluster."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--bench", type=Path, help="tools/bench_async.py's JSON (the check is skipped without it)"
    )
    ap.add_argument("--mfu", type=float, default=0.35)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="H200 dense bf16")
    ap.add_argument("--kept", type=float, default=0.5, help="fraction of episodes dynamic sampling keeps")
    ap.add_argument(
        "--decode-tok-s", type=float, default=25.0, help="decode speed of one sequence in a batch"
    )
    ap.add_argument("--tokens-per-turn", type=float, default=150.0)
    ap.add_argument("--tool-s", type=float, default=3.0, help="tool execution + prefill seconds per turn")
    ap.add_argument("--turns1", type=int, default=25)
    ap.add_argument("--turns2", type=int, default=45)
    ap.add_argument("--tokens1", type=float, default=20e3, help="mean trajectory tokens, stage 1")
    ap.add_argument("--tokens2", type=float, default=40e3, help="mean trajectory tokens, stage 2")
    ap.add_argument("--per-server1", type=int, default=48, help="concurrent episodes per server (KV bound)")
    ap.add_argument("--per-server2", type=int, default=24)
    ap.add_argument("--fs-write-gb-s", type=float, default=20.0)
    ap.add_argument("--sync-s", type=float, default=2.9)
    a = ap.parse_args()
    if a.bench:
        check(json.loads(a.bench.read_text()))
    paper(a)


if __name__ == "__main__":
    main()
