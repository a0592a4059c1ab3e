"""How long the rollout controller's threads held the GIL, from py-spy's GIL-only samples of a simulation.

The controller is one Python process: the GIL-held time per turn, not its CPU time (the tokenizer's batch
encode/decode and socket I/O release the GIL), is what caps the turns per second it can serve. Usage (py-spy
from PyPI, `pip install py-spy`; figures in docs/benchmarks.md, "Scale"):

    py-spy record --gil --rate 50 --nonblocking --format raw -o gil.txt -- \\
        .venv/bin/python tools/sim_scale.py --levels 64 --episodes-per-level 64 ... --json sim.json
    .venv/bin/python tools/gil_share.py gil.txt sim.json

Counts the samples whose stack is in the rollout's threads (episodes, routing, sandbox prewarm, clients; not
the imports and setup before the phase), divides by the rate and by the phase's turns, and lists the frames
(the innermost swe_megatron one) that held the GIL most.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

ROLLOUT = (
    "rollout/rollouts.py",
    "rollout/routing.py",
    "sandbox/prewarm.py",
    "sandbox/client.py",
    "engine/vllm.py",
)
"""A sample whose stack passes through one of these files is the rollout's work."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("samples", help="py-spy record --gil --format raw output")
    p.add_argument("sim", help="tools/sim_scale.py --json output of the same run (its turns)")
    p.add_argument("--rate", type=float, default=50.0, help="py-spy's --rate")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    with open(args.sim) as f:
        turns = sum(level["turns"] for level in json.load(f)["levels"])
    with open(args.samples) as f:
        lines = f.read().splitlines()
    held, frames = 0, Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        if not any(f in part for part in parts for f in ROLLOUT):
            continue
        held += int(count)
        ours = [part for part in parts if "swe_megatron/" in part]
        frames[(ours or parts)[-1]] += int(count)
    seconds = held / args.rate
    print(
        f"rollout threads held the GIL {seconds:.1f} s over {turns} turns: "
        f"{1000 * seconds / turns:.2f} ms a turn"
    )
    for frame, n in frames.most_common(args.top):
        print(f"{1000 * n / args.rate / turns:7.2f} ms/turn  {frame}")


if __name__ == "__main__":
    main()
