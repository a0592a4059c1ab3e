"""`swe-megatron plan [PRESET] [--model PRESET --context N --gpus N]`: trainer layouts and their memory per GPU,
weight-sync time, and (given a run preset) the rollout phase of one iteration of each stage.

Lists every valid TP x PP x CP x DP layout for the model at that context length on that many trainer GPUs,
with estimated GiB per GPU (weights, fp32 grads, Adam state with and without the distributed optimizer,
activations with the chosen recomputation) and flags those that do not fit; the first row is the
recommended layout. Then the seconds of one weight update to the engines by file and by broadcast
(`estimate_sync`; servers and pipeline stages from a run preset, bandwidths from the flags). The assumptions
are in `swe_megatron/train/memory_plan.py`. With a run preset (`swe-megatron plan paper-72b`) --model, --context
and --gpus default to it (the model, its longest stage context, parallel.world_size), and the rollout phase of
each stage follows (rollout/plan.py; every assumption a flag).
"""

from __future__ import annotations

import argparse
import math

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swe_megatron.config import ConfigError
from swe_megatron.config.load import find_preset, load_config
from swe_megatron.config.schema import STAGE_NAMES, ModelConfig, Recompute
from swe_megatron.errors import UsageError
from swe_megatron.rollout.plan import RolloutAssumptions, format_phases
from swe_megatron.train.memory_plan import (
    estimate_checkpoint,
    estimate_sync,
    format_table,
    plan_layouts,
    sync_working_bytes,
)


def load_model_preset(name: str) -> ModelConfig:
    """The ModelConfig of a run preset (paper-72b) or a model fragment (qwen2.5-72b-instruct, model/...)."""
    try:
        return OmegaConf.to_object(load_config(name).model)
    except ConfigError:
        pass
    # A model fragment alone is not a valid run (stage contexts may exceed its length): read just `model:`.
    for candidate in (name, f"model/{name}"):
        try:
            path = find_preset(candidate)
        except ConfigError:
            continue
        data = yaml.safe_load(path.read_text()) or {}
        if "model" in data:
            try:
                return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), data["model"]))
            except OmegaConfBaseException as e:
                raise ConfigError(f"{path}: model section is invalid: {e}") from None
    raise ConfigError(
        f"model preset {name!r} not found: give a run preset (e.g. paper-72b), a model preset "
        "under configs/model/ (e.g. qwen2.5-72b-instruct) or a YAML path"
    )


def _sync_shape(name: str) -> tuple[int, int, str]:
    """(vLLM servers, trainer pipeline stages, where from) of a run preset; (1, 1, ...) for a model preset."""
    try:
        cfg = load_config(name)
    except ConfigError:
        return 1, 1, "a model preset: 1 server, PP 1"
    return cfg.engine.num_servers, cfg.parallel.pipeline_parallel, f"{name}: engine.num_servers, PP"


def _print_sync(args: argparse.Namespace, model: ModelConfig) -> None:
    servers, pp, source = _sync_shape(args.model)
    e = estimate_sync(model, servers, pp, args.fs_write_gbps, args.fs_read_gbps, args.nic_gbps)
    gb = e.bytes / 1e9
    print(
        f"\nweight sync per update ({gb:.1f} GB of weights: params x 2 bytes bf16; {servers} vLLM servers, "
        f"PP {pp} ({source}); estimates, assumptions in memory_plan.estimate_sync):\n"
        f"  file:      write {gb:.1f} GB at {args.fs_write_gbps:g} GB/s = {e.file_write_s:.1f} s + {servers} servers "
        f"read {servers * gb:.1f} GB at {args.fs_read_gbps:g} GB/s (shared filesystem, all at once) = "
        f"{e.file_read_s:.1f} s -> {e.file_s:.1f} s\n"
        f"  broadcast: PP gather {gb * (pp - 1) / pp:.1f} GB = {e.gather_s:.1f} s + broadcast {gb:.1f} GB at "
        f"{args.nic_gbps:g} GB/s (rank 0's NIC, each byte once) = {e.broadcast_s:.1f} s -> "
        f"{e.total_broadcast_s:.1f} s"
    )


def _print_checkpoint(args: argparse.Namespace, model: ModelConfig, cfg) -> None:
    keep = cfg.checkpoint.keep_last if cfg is not None else 1
    c = estimate_checkpoint(model, args.fs_write_gbps, keep)
    tb = 1e12
    print(
        f"\ncheckpoint per committed unit (RUN/checkpoints/UNIT; estimates, memory_plan.estimate_checkpoint): dist/ "
        f"weights {c.weights / tb:.2f} TB + Adam state {c.optimizer / tb:.2f} TB, hf/ {c.hf / tb:.2f} TB = "
        f"{c.total / tb:.2f} TB, written at {args.fs_write_gbps:g} GB/s (--fs-write-gbps) = {c.write_s:.0f} s; "
        f"live on the filesystem: checkpoint.keep_last {keep} + the unit being written = {c.live / tb:.2f} TB"
    )


def _from_preset(args: argparse.Namespace):
    """The run preset of args (None without one), with --model/--context/--gpus filled in from it."""
    if args.preset is None:
        if args.model is None or args.context is None or args.gpus is None:
            raise UsageError(
                "give a run preset (swe-megatron plan paper-72b) or --model, --context and --gpus"
            )
        return None
    cfg = load_config(args.preset)
    args.model = args.model or args.preset
    stages = [s for s in cfg.schedule if s in STAGE_NAMES]
    args.context = args.context or max([cfg[s].context_length for s in stages] or [cfg.eval.context_length])
    args.gpus = args.gpus or cfg.parallel.world_size
    return cfg


def _assumptions(args: argparse.Namespace) -> RolloutAssumptions:
    return RolloutAssumptions(
        turns_fraction=args.turns_fraction, first_prompt_tokens=args.first_prompt_tokens,
        gen_tokens_per_turn=args.gen_tokens, obs_tokens_per_turn=args.obs_tokens, decode_tps=args.decode_tps,
        prefill_tps=args.prefill_tps, tool_s=args.tool_s, gpu_gib=args.gpu_gib, prefix_cache=not args.no_prefix_cache,
    )  # fmt: skip


POSITIVE = ("context", "gpus", "gpus_per_node", "gpu_gib", "top", "fs_write_gbps", "fs_read_gbps", "nic_gbps")
"""plan's numbers that must be > 0 (and finite); usable_fraction is in (0, 1], overhead_gib >= 0."""


def _check_numbers(args: argparse.Namespace) -> None:
    bad = [
        f"--{k.replace('_', '-')} {getattr(args, k)} (allowed: > 0)"
        for k in POSITIVE
        if not 0 < getattr(args, k) < math.inf
    ]
    if not 0 < args.usable_fraction <= 1:
        bad.append(f"--usable-fraction {args.usable_fraction} (allowed: 0 < f <= 1)")
    if not 0 <= args.overhead_gib < math.inf:
        bad.append(f"--overhead-gib {args.overhead_gib} (allowed: >= 0)")
    if bad:
        raise UsageError("invalid: " + "; ".join(bad))


def _presets_layout(args: argparse.Namespace, cfg, layouts) -> tuple:
    """(the row of the run preset's own parallel layout among `layouts` or None, a line saying whether it fits);
    (None, "") without a run preset or when --model plans another model."""
    if cfg is None or args.model != args.preset:
        return None, ""
    p = cfg.parallel
    tp, pp, cp = p.tensor_parallel, p.pipeline_parallel, p.context_parallel
    line = f"the preset's layout ({args.preset}: TP {tp}, PP {pp}, CP {cp}, DP {p.world_size // (tp * pp * cp)} on "
    line += f"{p.world_size} GPUs): "
    if args.gpus != p.world_size:
        return None, line + f"is not one of these ({args.gpus} GPUs, --gpus)"
    own = next((x for x in layouts if (x.tp, x.pp, x.cp) == (tp, pp, cp)), None)
    if own is None:
        return None, line + "is not one of these (not a valid layout of this model on these GPUs)"
    fits = "fits" if own.fits else f"does NOT fit (over {own.budget:.0f} GiB)"
    return own, line + f"{own.total:.1f} GiB per GPU, {fits} (marked in the table)"


def _plan(args: argparse.Namespace) -> int:
    cfg = _from_preset(args)
    _check_numbers(args)
    if cfg is not None:
        print(format_phases(cfg, _assumptions(args)))
    model = load_model_preset(args.model)
    _print_sync(args, model)
    _print_checkpoint(args, model, cfg)
    # The sync's working set on trainer rank 0: the run preset's method and bucket, else a broadcast of 512 MiB.
    sync = ("broadcast", 512.0) if cfg is None else (cfg.engine.weight_sync, cfg.engine.weight_sync_bucket_mb)
    layouts = plan_layouts(
        model,
        args.context,
        args.gpus,
        gpus_per_node=args.gpus_per_node,
        gpu_gib=args.gpu_gib,
        recompute=Recompute(args.recompute),
        distributed_optimizer=not args.no_distributed_optimizer,
        overhead_gib=args.overhead_gib,
        usable_fraction=args.usable_fraction,
        sync_bytes=sync_working_bytes(model, *sync),
    )
    fitting = [x for x in layouts if x.fits]
    print(
        f"{model.name}: {args.context} tokens per sequence on {args.gpus} GPUs "
        f"({args.gpu_gib:g} GiB, {args.gpus_per_node} per node), recompute={args.recompute}, "
        f"distributed optimizer={'off' if args.no_distributed_optimizer else 'on'}; GiB per GPU, most "
        f"loaded GPU; {len(fitting)} of {len(layouts)} layouts fit"
    )
    shown = layouts if args.all else layouts[: args.top]
    own, own_line = _presets_layout(args, cfg, layouts)
    if own is not None and own not in shown:
        shown = [*shown, own]  # below the top rows, but the layout the preset runs with is always shown
    print(format_table(shown, marked=own) if shown else "no valid layout (check heads/layers/GPU count)")
    if own_line:
        print(own_line)
    if fitting:
        best = fitting[0]
        print(
            f"recommended: parallel.tensor_parallel={best.tp} parallel.pipeline_parallel={best.pp} "
            f"parallel.context_parallel={best.cp} parallel.world_size={args.gpus} (DP {best.dp}), "
            f"sequence_parallel={'true' if best.tp > 1 else 'false'}"
        )
        return 0
    full = args.recompute == Recompute.full.value  # then suggesting it again would be no advice
    print(
        "no layout fits: more GPUs"
        + (" or a shorter context" if full else ", a shorter context or --recompute full")
    )
    return 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add the plan subcommand."""
    p = sub.add_parser(
        "plan", help="trainer layouts (TP/PP/CP/DP) with memory per GPU, weight sync, rollout phase per stage"
    )
    p.add_argument(
        "preset", nargs="?", help="run preset (paper-72b): defaults for the three below + rollout phase"
    )
    p.add_argument("--model", help="run preset (paper-72b) or model preset (qwen2.5-72b-instruct)")
    p.add_argument("--context", type=int, help="tokens per sequence (e.g. 131072)")
    p.add_argument("--gpus", type=int, help="trainer GPUs in all")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node; TP stays within a node")
    p.add_argument("--gpu-gib", type=float, default=140.0, help="memory per GPU in GiB (H200: 140)")
    p.add_argument("--recompute", choices=[r.value for r in Recompute], default="full")
    p.add_argument(
        "--no-distributed-optimizer", action="store_true", help="replicate Adam state on every DP rank"
    )
    p.add_argument(
        "--overhead-gib", type=float, default=8.0, help="fixed per-GPU overhead (context, NCCL, TE)"
    )
    p.add_argument("--usable-fraction", type=float, default=0.9, help="share of GPU memory a layout may use")
    p.add_argument("--top", type=int, default=12, help="rows shown (recommendation order)")
    p.add_argument("--all", action="store_true", help="show every valid layout")
    p.add_argument(
        "--fs-write-gbps",
        type=float,
        default=10.0,
        help="shared filesystem write GB/s (weight sync by file, checkpoint write time)",
    )
    p.add_argument(
        "--fs-read-gbps",
        type=float,
        default=20.0,
        help="weight sync: shared filesystem read GB/s, all readers",
    )
    p.add_argument(
        "--nic-gbps", type=float, default=50.0, help="weight sync: GB/s of one NIC (400 Gb/s IB: 50)"
    )
    a = RolloutAssumptions()
    g = p.add_argument_group("rollout phase assumptions (with a run preset)")
    g.add_argument("--turns-fraction", type=float, default=a.turns_fraction, help="mean turns / t_max")
    g.add_argument(
        "--first-prompt-tokens", type=int, default=a.first_prompt_tokens, help="first prompt tokens"
    )
    g.add_argument("--gen-tokens", type=int, default=a.gen_tokens_per_turn, help="tokens generated per turn")
    g.add_argument(
        "--obs-tokens", type=int, default=a.obs_tokens_per_turn, help="observation tokens per turn"
    )
    g.add_argument("--decode-tps", type=float, default=a.decode_tps, help="tokens/s one server generates")
    g.add_argument("--prefill-tps", type=float, default=a.prefill_tps, help="tokens/s one server prefills")
    g.add_argument("--tool-s", type=float, default=a.tool_s, help="seconds per sandbox command")
    g.add_argument(
        "--no-prefix-cache", action="store_true", help="engines prefill every turn's whole context"
    )
    p.set_defaults(func=_plan)
