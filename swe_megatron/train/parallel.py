"""Process groups of the trainer: torch.distributed + Megatron-Core model-parallel state from ParallelConfig.

The model files hold no parallelism; this module is the one place that creates groups. On a machine
without CUDA it initialises gloo and applies `cpu_compat` first; on GPUs it uses NCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.net import free_port  # ranks' rendezvous port; re-exported for callers of this module
from swe_megatron.train import cpu_compat


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    local_rank: int | None = None,
) -> None:
    """Start torch.distributed (gloo on CPU, NCCL on GPU) unless it already runs.

    local_rank: this rank's index on its node (picks the GPU); None: rank modulo the node's GPU count.
    """
    if dist.is_initialized():
        return
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
    else:
        cpu_compat.enable()
    dist.init_process_group(
        backend="nccl" if on_gpu else "gloo",
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
    )


def init_model_parallel(parallel: ParallelConfig, seed: int = 0) -> None:
    """Create Megatron-Core's TP/PP/CP/DP groups for `parallel` and seed its RNG tracker.

    torch.distributed must be running (`init_distributed`); data parallel is the world size left over.
    """
    from megatron.core import parallel_state, tensor_parallel

    cpu_compat.refuse_unsupported(parallel.context_parallel, parallel.sequence_parallel, parallel.recompute)
    if not torch.cuda.is_available():
        cpu_compat.enable()
    world = dist.get_world_size()
    model_parallel = parallel.tensor_parallel * parallel.pipeline_parallel * parallel.context_parallel
    if world % model_parallel:
        raise ValueError(
            f"world size {world} is not a multiple of tensor_parallel x pipeline_parallel x context_parallel "
            f"= {model_parallel}: change parallel.* or the number of trainer ranks."
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
        context_parallel_size=parallel.context_parallel,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)


def destroy() -> None:
    """Tear down model-parallel state and the process group."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def data_parallel_info() -> tuple[int, int]:
    """(rank, size) of this process in its data-parallel group."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


__all__ = ["init_distributed", "init_model_parallel", "destroy", "free_port", "data_parallel_info"]
