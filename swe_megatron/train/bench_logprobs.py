"""Peak memory and time of action-token logprobs: chunked action-only vs full-sequence logits (CPU).

    python -m swe_megatron.train.bench_logprobs --seq 8192 --vocab 151936 --hidden 896

Each variant runs forward + backward in a fresh process (peak RSS is per process), on one rank
(TP=1, no Megatron groups needed: `action_logprobs` reduces over TP only when a group is given).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def _run(variant: str, seq: int, vocab: int, hidden: int, action_frac: float) -> dict:
    from swe_megatron.train import cpu_compat
    from swe_megatron.train.logprobs import action_logprobs, full_logprobs_reference

    cpu_compat.enable()
    g = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(seq, 1, hidden, generator=g).mul_(0.1).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=g).mul_(0.02).requires_grad_()
    rows = torch.nonzero(torch.rand(seq, generator=g) < action_frac)[:, 0]
    targets = torch.randint(0, vocab, (rows.numel(),), generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if variant == "action":
        lp = action_logprobs(hidden_states, weight, rows, targets)
    else:
        logits = hidden_states[:, 0] @ weight.t()  # [seq, vocab]: what a plain forward builds
        lp = full_logprobs_reference(logits, torch.cat([targets, targets.new_zeros(seq - targets.numel())]))[
            : targets.numel()
        ]
    lp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "seconds": seconds,
        "peak_extra_mib": (peak - base) / 1024,
        "actions": rows.numel(),
    }


def main(argv: list[str] | None = None) -> None:
    """Run both variants in subprocesses and print one JSON line each plus the ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--action-frac", type=float, default=0.3)
    p.add_argument("--variant", choices=["action", "full"], default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.variant:
        print(json.dumps(_run(a.variant, a.seq, a.vocab, a.hidden, a.action_frac)))
        return
    results = {}
    for variant in ("action", "full"):
        cmd = [sys.executable, "-m", "swe_megatron.train.bench_logprobs", "--variant", variant]
        cmd += ["--seq", str(a.seq), "--vocab", str(a.vocab), "--hidden", str(a.hidden)]
        cmd += ["--action-frac", str(a.action_frac)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results[variant] = json.loads(out)
        print(out)
    full, act = results["full"], results["action"]
    print(
        json.dumps(
            {
                "memory_ratio_full_over_action": full["peak_extra_mib"] / max(act["peak_extra_mib"], 1e-9),
                "time_ratio_full_over_action": full["seconds"] / act["seconds"],
            }
        )
    )


if __name__ == "__main__":
    main()
