"""Peak memory and time of action-token logprobs: chunked action-only vs full-sequence logits (CPU).

Figures in docs/benchmarks.md ("Trainer"). Usage, from the repo root:

    OMP_NUM_THREADS=2 .venv/bin/python tools/bench_logprobs.py --seq 8192 --vocab 151936 --hidden 128

`--scoring N` instead times one chunk's scoring side by side in this process: the trainer's (`_chunk_logprobs`,
the fused cross-entropy kernel at TP=1) against the `gather - logsumexp` it replaced, on N action rows, forward
without grad and checkpointed forward + backward, medians of `--repeats`.

"action" is what the trainer runs (`swe_megatron.train.logprobs.action_logprobs`: gather the hidden states of
the action rows, score them in chunks of 1024 under activation checkpointing); "full" is what a plain
forward builds ([seq x vocab] logits, log_softmax, gather). Each variant runs in a fresh process (peak RSS
is per process) on one rank (TP=1). A variant whose estimated peak would not fit in the memory available
right now (MemAvailable / 2, the machine is shared) is not started: pass a shorter --full-seq or
--forward-only for it, and the figures say which was measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _run(variant: str, seq: int, vocab: int, hidden: int, action_frac: float, backward: bool) -> dict:
    from swe_megatron.train import cpu_compat
    from swe_megatron.train.logprobs import action_logprobs, full_logprobs_reference

    cpu_compat.enable()
    g = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(seq, 1, hidden, generator=g).mul_(0.1).requires_grad_(backward)
    weight = torch.randn(vocab, hidden, generator=g).mul_(0.02).requires_grad_(backward)
    rows = torch.nonzero(torch.rand(seq, generator=g) < action_frac)[:, 0]
    targets = torch.randint(0, vocab, (rows.numel(),), generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        if variant == "action":
            lp = action_logprobs(hidden_states, weight, rows, targets)
        else:
            logits = hidden_states[:, 0] @ weight.t()  # [seq, vocab]: what a plain forward builds
            lp = full_logprobs_reference(
                logits, torch.zeros(seq, dtype=torch.long).index_copy(0, rows, targets)
            )
            lp = lp.index_select(0, rows)
        if backward:
            lp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "seq": seq,
        "backward": backward,
        "seconds": round(seconds, 3),
        "peak_extra_mib": round((peak - base) / 1024, 1),
        "actions": rows.numel(),
    }


def _scoring(n_rows: int, vocab: int, hidden: int, repeats: int) -> dict:
    """Median seconds of one chunk's scoring: the trainer's kernel against `gather - logsumexp`, alternating."""
    import statistics

    import torch.utils.checkpoint

    from swe_megatron.train.logprobs import _chunk_logprobs

    def before(rows, weight, targets, tp_group):
        logits = torch.matmul(rows, weight.t()).float()
        return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(n_rows, hidden, generator=g).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=g).mul_(0.02).requires_grad_()
    targets = torch.randint(0, vocab, (n_rows,), generator=g)
    times: dict[str, list[tuple[float, float]]] = {"trainer": [], "gather_logsumexp": []}
    for _ in range(repeats):
        for name, fn in (("trainer", _chunk_logprobs), ("gather_logsumexp", before)):
            rows.grad = weight.grad = None
            start = time.perf_counter()
            with torch.no_grad():
                fn(rows, weight, targets, None)
            mid = time.perf_counter()
            torch.utils.checkpoint.checkpoint(
                fn, rows, weight, targets, None, use_reentrant=False
            ).sum().backward()
            times[name].append((mid - start, time.perf_counter() - mid))
    with torch.no_grad():
        diff = (
            (_chunk_logprobs(rows, weight, targets, None) - before(rows, weight, targets, None)).abs().max()
        )
    out = {"rows": n_rows, "vocab": vocab, "hidden": hidden, "repeats": repeats, "max_abs_diff": float(diff)}
    for name, t in times.items():
        out[f"{name}_forward_s"] = round(statistics.median(a for a, _ in t), 3)
        out[f"{name}_forward_backward_s"] = round(statistics.median(b for _, b in t), 3)
    return out


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def full_estimate_bytes(seq: int, vocab: int, backward: bool) -> int:
    """Rough peak of the full variant: fp32 logits + log_softmax (+ their two gradients in the backward)."""
    return seq * vocab * 4 * (4 if backward else 2)


def main(argv: list[str] | None = None) -> None:
    """Run both variants in subprocesses; print one JSON line each plus the ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192, help="sequence length of the action-only run")
    p.add_argument(
        "--full-seq", type=int, default=None, help="sequence length of the full run (default --seq)"
    )
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--action-frac", type=float, default=0.3)
    p.add_argument("--forward-only", action="store_true", help="no backward (both variants)")
    p.add_argument("--variant", choices=["action", "full"], default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--scoring", type=int, default=0, metavar="N", help="time one chunk's scoring of N rows only"
    )
    p.add_argument("--repeats", type=int, default=5, help="with --scoring: runs of each, alternating")
    a = p.parse_args(argv)
    if a.scoring:
        print(json.dumps(_scoring(a.scoring, a.vocab, a.hidden, a.repeats)))
        return
    backward = not a.forward_only
    if a.variant:
        seq = a.seq if a.variant == "action" else (a.full_seq or a.seq)
        print(json.dumps(_run(a.variant, seq, a.vocab, a.hidden, a.action_frac, backward)))
        return
    full_seq = a.full_seq or a.seq
    need, have = full_estimate_bytes(full_seq, a.vocab, backward), _available_bytes() // 2
    if need > have:
        sys.exit(
            f"full logits at seq {full_seq} need ~{need / 2**30:.1f} GiB, more than half the memory available "
            f"now ({have / 2**30:.1f} GiB): use --full-seq N or --forward-only"
        )
    results = {}
    for variant in ("action", "full"):
        cmd = [sys.executable, __file__, "--variant", variant, "--seq", str(a.seq), "--vocab", str(a.vocab)]
        cmd += ["--hidden", str(a.hidden), "--action-frac", str(a.action_frac), "--full-seq", str(full_seq)]
        cmd += ["--forward-only"] if a.forward_only else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results[variant] = json.loads(out)
        print(out, flush=True)
    full, act = results["full"], results["action"]
    scale = a.seq / full_seq  # full logits scale linearly with the sequence
    print(
        json.dumps(
            {
                "memory_ratio_full_over_action": round(
                    full["peak_extra_mib"] * scale / max(act["peak_extra_mib"], 1e-9), 1
                ),
                "time_ratio_full_over_action": round(full["seconds"] * scale / act["seconds"], 2),
                "full_scaled_from_seq": full_seq if full_seq != a.seq else None,
            }
        )
    )


if __name__ == "__main__":
    main()
