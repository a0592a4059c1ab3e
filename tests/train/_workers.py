"""Shared pieces of the trainer tests: a tiny HF Qwen2, a fixed batch, and a gloo multi-rank launcher.

Worker functions live here (not in the test files) so spawned ranks can import them.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

from swe_megatron.config.schema import OptimConfig, ParallelConfig
from swe_megatron.train import parallel
from swe_megatron.train.packing import TrainSample

VOCAB = 256


def tiny_hf(tie: bool = False, seed: int = 0, rope: dict | None = None, arch: str = "qwen2"):
    """A randomly initialised tiny Qwen2 (or Llama) from transformers, fp32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
    )
    if rope:
        kw["rope_parameters"] = rope
    torch.manual_seed(seed)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).float().eval()
    model = Qwen2ForCausalLM(Qwen2Config(**kw)).float().eval()
    with torch.no_grad():  # HF zero-initialises nothing we care about, but make biases non-trivial
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def batch(n: int = 8, seed: int = 3) -> list[TrainSample]:
    """Trajectories of varied lengths with random action masks, advantages and engine logprobs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 40, (1,), generator=g))
        tokens = torch.randint(0, VOCAB, (length,), generator=g)
        mask = torch.rand(length, generator=g) > 0.4
        mask[0] = False
        out.append(
            TrainSample(
                tokens,
                mask,
                advantage=float(torch.randn(1, generator=g)),
                engine_logprobs=-5.5 + 0.1 * torch.randn(length, generator=g),
            )
        )
    return out


OPTIM = OptimConfig(lr=1e-4, warmup_steps=1, grad_clip=0.0, weight_decay=0.1)


def _entry(rank: int, world: int, port: int, out: str, fn, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        parallel.init_distributed(rank, world, master_port=port)
        result = fn(rank, *args)
        torch.save(result, f"{out}/rank{rank}.pt")
    except Exception:
        Path(f"{out}/rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        parallel.destroy()


def run_ranks(fn, world: int, tmp: Path, *args, timeout_s: float = 900.0) -> list:
    """Run fn(rank, *args) on `world` gloo ranks in fresh processes; returns each rank's result.

    Ranks still running after timeout_s (e.g. stuck in mismatched collectives) are killed: an AssertionError.
    """
    import time

    tmp.mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(
        _entry,
        args=(world, parallel.free_port(), str(tmp), fn, args),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError(f"ranks still running after {timeout_s:.0f} s (a hang?)")
    except AssertionError:
        raise
    except Exception as exc:
        errs = "\n".join(p.read_text() for p in sorted(tmp.glob("rank*.err")))
        raise AssertionError(f"a rank failed:\n{errs or exc}") from exc
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


def capture(trainer) -> dict:
    """HF-named weights and grads of the whole model, merged over TP and pipeline stages."""
    import torch.distributed as dist

    from swe_megatron.train.hf_convert import hf_state_of_stage

    cfg, module = trainer.model_cfg, trainer.model.module
    mine = {
        "weights": hf_state_of_stage(module, cfg, trainer.tp_group),
        "grads": hf_state_of_stage(module, cfg, trainer.tp_group, grads=True),
    }
    stages = [None] * dist.get_world_size(trainer.pp_group)
    dist.all_gather_object(stages, mine, group=trainer.pp_group)
    return {k: {n: t for s in stages for n, t in s[k].items()} for k in ("weights", "grads")}


def train_and_capture(
    rank, model_cfg, par: ParallelConfig, hf_state, samples, num_steps, kind="dapo", save=None, export=None,
    off_policy=None,
):  # fmt: skip
    """Initialise `par`, build a Trainer from `hf_state`, run one update; metrics, weights and grads.

    off_policy: an OffPolicyConfig for the DAPO loss (None: off)."""
    from swe_megatron.train.step import LossSpec, Trainer

    parallel.init_model_parallel(par, seed=1)
    trainer = Trainer(model_cfg, par, OPTIM, total_steps=10, hf_state=hf_state)
    spec = LossSpec(kind) if off_policy is None else LossSpec(kind, off_policy=off_policy)
    metrics = trainer.update(samples, num_steps, spec)
    out = {"metrics": metrics, **capture(trainer)}
    if save is not None:
        trainer.save(save)
    if export is not None:
        out["export"] = trainer.export(export)
    return out


def layouts(rank, model_cfg, hf_state, samples, num_steps, ckpt):
    """TP=2, PP=2, DP=2 and DP=2 with the distributed optimizer (2 ranks) runs of the same update; the TP=2 run also saves a checkpoint to `ckpt`."""
    out = {}
    for name, par in {
        "tp2": ParallelConfig(tensor_parallel=2, micro_batch_tokens=64),
        "pp2": ParallelConfig(pipeline_parallel=2, micro_batch_tokens=64),
        "dp2": ParallelConfig(micro_batch_tokens=64),
        "dp2-distopt": ParallelConfig(micro_batch_tokens=64, use_distributed_optimizer=True),
    }.items():
        out[name] = train_and_capture(
            rank,
            model_cfg,
            par,
            hf_state,
            samples,
            num_steps,
            save=f"{ckpt}/ckpt" if name == "tp2" else None,
            export=f"{ckpt}/export-{name}",
        )
    return out


def _host_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_host_bytes(fn, *args):
    """(fn(*args), how far this process's resident memory rose above its start during the call)."""
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current resident size
    start = _host_bytes("VmRSS")
    result = fn(*args)
    return result, _host_bytes("VmHWM") - start


def export_memory(rank, model_cfg, par: ParallelConfig, out: str, max_shard_bytes: int) -> dict:
    """Build `par`'s model stage (no optimiser) and export it; the report and the export's peak host bytes."""
    from megatron.core import parallel_state as ps

    from swe_megatron.train.export import export_hf
    from swe_megatron.train.model import build_model

    parallel.init_model_parallel(par, seed=1)
    module = build_model(model_cfg, par)
    groups = (ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group())
    report, peak = peak_host_bytes(
        export_hf, module, model_cfg, out, *groups, ps.get_data_parallel_group(), max_shard_bytes
    )
    return {"report": report, "peak": peak, "tp_rank": ps.get_tensor_model_parallel_rank()}


def export_with_context_parallel(rank, model_cfg, out: str) -> dict:
    """A Trainer on 2 ranks laid out as context_parallel=2 exports; what its report says.

    CPU runs refuse CP (its attention needs Transformer Engine), so the groups are made directly and the
    model is built with CP=1 shapes (CP does not change parameter shapes): only the export's choice of
    writer is exercised, which is all this needs.
    """
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from swe_megatron.train.step import Trainer

    ps.initialize_model_parallel(context_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1, force_reset_rng=True)
    trainer = Trainer(model_cfg, ParallelConfig(), OPTIM, total_steps=1)
    report = trainer.export(out)
    return {"report": report, "cp_rank": ps.get_context_parallel_rank()}


def build_memory(rank, model_cfg, par: ParallelConfig, initialize: bool) -> dict:
    """Peak host bytes of building `par`'s model stage with or without its random init; its own bytes."""
    from swe_megatron.train.model import build_model

    parallel.init_model_parallel(par, seed=1)
    module, peak = peak_host_bytes(build_model, model_cfg, par, True, True, initialize)
    own = sum(p.numel() * p.element_size() for p in module.parameters())
    return {"peak": peak, "own": own, "perform_initialization": module.config.perform_initialization}


class SlowEngine:
    """An engine whose weight reload takes `seconds` (a 72B reload takes minutes): what the others wait for."""

    def __init__(self, seconds: float):
        self.seconds, self.reloaded = seconds, []

    def reload_weights(self, path: str) -> None:
        """Wait, then record the folder."""
        import time

        time.sleep(self.seconds)
        self.reloaded.append(path)


def sync_with_slow_reload(rank, model_cfg, out: str, port: int, collective_timeout_s: float, reload_s: float):
    """The file weight sync on 2 DP ranks whose default group times out after collective_timeout_s (as NCCL's
    watchdog would), while rank 0's engines take reload_s to reload; the driver group waits long enough."""
    from datetime import timedelta

    import torch.distributed as dist

    from swe_megatron.train.step import Trainer
    from swe_megatron.train.weight_sync import FileWeightSync

    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=collective_timeout_s))  # fmt: skip
    par = ParallelConfig()
    parallel.init_model_parallel(par, seed=1)
    driver_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=10 * reload_s))
    trainer = Trainer(model_cfg, par, OPTIM, total_steps=1, wait_group=driver_group)
    engine = SlowEngine(reload_s) if rank == 0 else None
    report = FileWeightSync().sync(trainer, engine, out)
    trainer.save(f"{out}-dist")
    return {"reloaded": engine.reloaded if engine else None, "reload_s": report.reload_s}


def broadcast_stream(rank, model_cfg, par: ParallelConfig, hf_state) -> dict | None:
    """What global rank 0 would broadcast (every HF tensor, gathered over TP and PP), as {name: tensor}."""
    from megatron.core import parallel_state as ps

    from swe_megatron.train.step import Trainer
    from swe_megatron.train.weight_sync import _stage_to_rank0, _stream_to_rank0

    parallel.init_model_parallel(par, seed=1)
    trainer = Trainer(model_cfg, par, OPTIM, total_steps=1, hf_state=hf_state)
    if rank == 0:
        return dict(_stream_to_rank0(trainer, torch.device("cpu")))
    _stage_to_rank0(trainer, ps.get_tensor_model_parallel_rank() == 0)
    return None


def off_policy_with_context_parallel(rank, model_cfg, samples, off) -> dict:
    """Trainer.off_policy on 2 ranks laid out as context_parallel=2 (groups made directly, as in
    export_with_context_parallel): each rank holds its CP share of the same micro-batches, with made-up old
    logprobs. Returns its weights, its metrics, and its share of the one-rank reference weights."""
    import dataclasses

    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from swe_megatron.algo.off_policy import off_policy_weights
    from swe_megatron.train.packing import pack, split_for_context_parallel
    from swe_megatron.train.step import Trainer

    ps.initialize_model_parallel(context_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1, force_reset_rng=True)
    trainer = Trainer(model_cfg, ParallelConfig(), OPTIM, total_steps=1)
    g = torch.Generator().manual_seed(0)
    out = {"weights": [], "reference": []}
    mine = []
    for mb in pack(samples, 64, pad_multiple=4):
        mb.old_logprobs = mb.engine_logprobs + 0.3 * torch.randn(mb.num_action_tokens, generator=g)
        ref, _ = off_policy_weights(mb.old_logprobs, mb.engine_logprobs, torch.ones_like(mb.targets, dtype=bool),
                                    off.tis_cap, off.mask_threshold, mb.rows // mb.tokens.shape[1])  # fmt: skip
        mine.append(split_for_context_parallel(mb, rank, 2))
        out["reference"].append(
            split_for_context_parallel(dataclasses.replace(mb, old_logprobs=ref), rank, 2)
        )
    out["reference"] = [mb.old_logprobs for mb in out["reference"]]
    out["weights"], out["metrics"] = trainer.off_policy(mine, off)
    return out


def corrected_layouts(rank, model_cfg, hf_state, samples, num_steps, off_policy) -> dict:
    """PP=2 and DP=2 runs (2 ranks) of the same DAPO update with `off_policy` on."""
    return {
        name: train_and_capture(rank, model_cfg, par, hf_state, samples, num_steps, off_policy=off_policy)
        for name, par in {
            "pp2": ParallelConfig(pipeline_parallel=2, micro_batch_tokens=64),
            "dp2": ParallelConfig(micro_batch_tokens=64),
        }.items()
    }


def sender_holding(rank, model_cfg, par: ParallelConfig) -> dict | None:
    """The broadcast sync's stream to rank 0 (rank 0 taking each tensor slowly): on each later stage's sender,
    the peak bytes of its gathered tensors still alive (sent, not yet released), its stage's bytes and its
    largest tensor's; on rank 0, the names it got."""
    import time
    import weakref

    from megatron.core import parallel_state as ps

    from swe_megatron.train import weight_sync
    from swe_megatron.train.step import Trainer

    parallel.init_model_parallel(par, seed=1)
    trainer = Trainer(model_cfg, par, OPTIM, total_steps=1)
    if rank == 0:
        names = []
        for name, _ in weight_sync._stream_to_rank0(trainer, torch.device("cpu")):
            names.append(name)
            time.sleep(0.01)  # busy broadcasting
        return {"names": names}
    held = {"now": 0, "peak": 0, "stage": 0, "largest": 0}
    local = weight_sync._local_tensors

    def release(n: int) -> None:
        held["now"] -= n

    def counted(tr):
        for name, t in local(tr):
            n = t.numel() * t.element_size()
            held["now"] += n
            held["peak"] = max(held["peak"], held["now"])
            held["stage"] += n
            held["largest"] = max(held["largest"], n)
            weakref.finalize(t, release, n)
            yield name, t

    weight_sync._local_tensors = counted
    sender = ps.get_tensor_model_parallel_rank() == 0
    weight_sync._stage_to_rank0(trainer, sender)
    return {**held, "sender": sender} if sender else None
