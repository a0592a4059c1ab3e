"""Checkpoint save/load of a trainer's state with dist_checkpointing: model, optimiser and step count,
loadable at another TP/PP layout."""

from __future__ import annotations

import os
import queue

import torch
import torch.distributed as dist


def _in_process_write_results() -> None:
    """Let dist_checkpointing's writer collect its results in a thread queue, not a multiprocessing Manager.

    megatron-core 0.19.2's FileSystemWriterAsync (used by synchronous saves too) puts its write results in
    `get_write_results_queue()`: a `Manager().Queue()`, i.e. a spawned server process kept for the life of
    this one, which does not notice its parent's death (it outlived a SIGKILLed driver). Our saves are
    synchronous: the writer threads and the reader are in this process, so a `queue.Queue` serves.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


class CheckpointManager:
    """Saves and restores one trainer's model (DDP-wrapped) and optimiser; ranks wait in `wait_group`."""

    def __init__(self, model, optimizer, wait_group=None):
        self.model, self.optimizer, self.wait_group = model, optimizer, wait_group

    def _sharded_state(self, with_optimizer: bool, is_loading: bool = False) -> dict:
        model_sd = self.model.module.sharded_state_dict()
        if not with_optimizer:
            return {"model": model_sd}
        # Loading needs the optimizer state allocated first (a fresh Adam has none until its first step).
        return {
            "model": model_sd,
            "optimizer": self.optimizer.sharded_state_dict(model_sd, is_loading=is_loading),
        }

    def save(self, path: str, steps_done: int) -> None:
        """Save model, optimiser and `steps_done` into `path` (all ranks call it).

        Before the first optimiser step Adam has no state yet, so only the model is saved (and `load`
        restores such a checkpoint as a fresh optimiser on its weights).
        """
        from megatron.core import dist_checkpointing

        os.makedirs(path, exist_ok=True)
        _in_process_write_results()
        has_optimizer = steps_done > 0
        dist_checkpointing.save(self._sharded_state(has_optimizer), path)
        if dist.get_rank() == 0:
            torch.save({"steps_done": steps_done, "has_optimizer": has_optimizer}, f"{path}/trainer.pt")
        dist.barrier(group=self.wait_group)

    def load(self, path: str) -> int:
        """Restore a checkpoint written by `save`, whatever layout it was saved from; its steps_done."""
        from megatron.core import dist_checkpointing

        extra = torch.load(f"{path}/trainer.pt", weights_only=False)
        has_optimizer = extra.get("has_optimizer", True)
        state = dist_checkpointing.load(self._sharded_state(has_optimizer, is_loading=True), path)
        self.model.module.load_state_dict(state["model"])
        if has_optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # the optimiser's own fp32 copy of bf16 weights was taken at construction: refresh it
            self.optimizer.reload_model_params()
        return extra["steps_done"]
