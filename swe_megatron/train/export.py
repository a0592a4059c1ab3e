"""Hugging Face safetensors export of the trainer's weights, for vLLM reloads and transformers.

Sharded and streamed: in one model replica, each pipeline stage's TP-rank-0 process receives the full
(TP-gathered) tensors of its own layers one parameter at a time and writes them into files of at most
`max_shard_bytes` as they come; no rank ever holds the whole model, the writers one shard at most.
Atomic: everything is written into `<out>.tmp`, global rank 0 names the shards as the hub does
(`model.safetensors`, or `model-0000K-of-0000N.safetensors` and `model.safetensors.index.json`; mode 0644), adds
`config.json`,
then swaps the folder into place with renames, so a reader sees the old export or the new one, never a
half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from swe_megatron.config.schema import ModelConfig
from swe_megatron.model.hf_config import hf_config_dict, special_token_ids
from swe_megatron.train.hf_convert import iter_hf_of_stage


@dataclass
class ExportReport:
    """What an export wrote and how long it took."""

    path: str
    """The export folder."""
    seconds: float
    """Wall-clock time from start to the atomic rename (measured on global rank 0)."""
    bytes: int
    """Bytes of tensor data written."""
    files: int
    """Safetensors files written."""


def _write_stage(tensors, folder: Path, stage: int, max_shard_bytes: int) -> tuple[dict[str, str], int]:
    """Write (HF name, tensor) pairs as they come into files of at most `max_shard_bytes` (one tensor may
    exceed it); only the shard being filled is held. Returns ({name: file}, bytes written)."""
    where: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        fname = f"model-stage{stage:03d}-{len(set(where.values())):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        where.update(dict.fromkeys(shard, fname))
        shard.clear()

    for name, t in tensors:
        t = t.detach().to("cpu", copy=True).contiguous()
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
            size = 0
        shard[name] = t
        size += nbytes
        total += nbytes
    if shard:
        flush()
    return where, total


def _named_for_export(tensors, cfg: ModelConfig, name_tied_lm_head: bool):
    for name, t in tensors:
        yield name, t
        if name_tied_lm_head and cfg.tie_word_embeddings and name == "model.embed_tokens.weight":
            yield "lm_head.weight", t


def hub_shard_names(files: list[str]) -> dict[str, str]:
    """The stage writers' file names -> the hub's, in stage order: `model.safetensors` for a single file (as
    transformers' save_pretrained names it), else `model-0000K-of-0000N.safetensors`."""
    files = sorted(set(files))  # model-stageSSS-IIIII: pipeline stage, then the stage's own order
    if len(files) == 1:
        return {files[0]: "model.safetensors"}
    return {f: f"model-{k:05d}-of-{len(files):05d}.safetensors" for k, f in enumerate(files, 1)}


def _finish_folder(tmp: Path, out: Path, cfg: ModelConfig, weight_map: dict, total: int, extra_files) -> None:
    """Rank 0: name the shards as the hub does, write the index (several shards only), extra_files and config.json
    (with the BOS/EOS ids of the tokenizer among extra_files) into `tmp`, then put `tmp` in place of `out`."""
    names = hub_shard_names(list(weight_map.values()))
    for old, new in names.items():
        (tmp / old).rename(tmp / new)
        os.chmod(tmp / new, 0o644)  # safetensors writes 0600; engines on other users read the hub's files
    weight_map = {k: names[v] for k, v in weight_map.items()}
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for f in extra_files:
        shutil.copy(f, tmp / Path(f).name)
    (tmp / "config.json").write_text(json.dumps(hf_config_dict(cfg, special_token_ids(tmp)), indent=2))
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def export_hf(
    model,
    cfg: ModelConfig,
    out: str | os.PathLike,
    tp_group=None,
    pp_group=None,
    dp_group=None,
    max_shard_bytes: int = 4 << 30,
    extra_files: list[str | os.PathLike] = (),
    name_tied_lm_head: bool = False,
    wait_group=None,
) -> ExportReport:
    """Write this model (a GPTModel stage on every rank) as a HF checkpoint folder `out`; all ranks call it.

    One model replica writes: the ranks with rank 0 in `dp_group` (pass the data x context parallel group
    when context parallelism is on, so one context-parallel rank writes). In it each pipeline stage streams
    its tensors, one parameter at a time, to its TP-rank-0, which writes them into shards as they come: no
    rank holds a full copy of the weights, the writer at most one shard. extra_files (tokenizer files,
    generation config) are copied in by global rank 0. name_tied_lm_head also writes a tied model's
    `lm_head.weight` (a copy of the embedding): vLLM 0.32's in-place reload otherwise leaves the tied LM
    head on its old tensor (its layerwise reload restores modules that the checkpoint does not name), so
    weight syncs into running servers set it. wait_group: the group in which ranks wait for the writers
    and rank 0 (a gloo group with a long timeout, see Trainer.wait_group; None: the default group).
    """
    start = time.perf_counter()
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(wait_group)
    where, nbytes = {}, 0
    if _rank(dp_group) == 0:  # the other replicas hold the same weights
        tensors = iter_hf_of_stage(model, cfg, tp_group, dst=0)
        where, nbytes = _write_stage(
            _named_for_export(tensors, cfg, name_tied_lm_head), tmp, _rank(pp_group), max_shard_bytes
        )
    maps = [(where, nbytes)]
    if dist.is_initialized():
        maps = [None] * dist.get_world_size()
        dist.all_gather_object(maps, (where, nbytes), group=wait_group)
    weight_map = {k: v for m, _ in maps for k, v in m.items()}
    total = sum(n for _, n in maps)
    if rank == 0:
        _finish_folder(tmp, out, cfg, weight_map, total, extra_files)
    _barrier(wait_group)
    return ExportReport(str(out), time.perf_counter() - start, total, len(set(weight_map.values())))


def _rank(group) -> int:
    return dist.get_rank(group) if group is not None and dist.is_initialized() else 0


def _barrier(group) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)
