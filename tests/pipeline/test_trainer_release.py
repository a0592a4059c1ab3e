"""Stage changes release the previous trainer (model, optimiser, DDP buffers) before building the next one.

At 72B a trainer is the whole rank's device memory; two alive at once do not fit (issue 13 item 5).
"""

from __future__ import annotations

import gc
import weakref

from swe_megatron.config.load import load_config
from swe_megatron.monitor import NullMonitor
from swe_megatron.pipeline.run_dir import RunDir
from swe_megatron.pipeline.stages import Context, initial_policy, trainer_for
from swe_megatron.pipeline.topology import NullTopology
from swe_megatron.train import cpu_compat, parallel


def test_the_previous_stages_trainer_is_gone_before_the_next_is_built(tmp_path):
    cfg = load_config("embedded", [f"run_dir={tmp_path / 'run'}", "model.vocab_size=512"])
    parallel.init_distributed(0, 1, master_port=parallel.free_port())
    gc_was_on = gc.isenabled()
    gc.disable()  # only an explicit release frees a trainer caught in reference cycles
    try:
        parallel.init_model_parallel(cfg.parallel, seed=0)
        ctx = Context(cfg, RunDir(cfg.run_dir), NullTopology(), NullMonitor(), {}, [])
        initial_policy(ctx)
        init = weakref.ref(ctx.trainer)
        old = trainer_for(ctx, "rft", 2)
        assert init() is None, "the init unit's trainer is still alive next to the rft trainer"
        assert trainer_for(ctx, "rft", 2) is old  # kept while its stage runs
        freed_while = []
        ref = weakref.ref(old, lambda _: freed_while.append(ctx.trainer))
        del old
        new = trainer_for(ctx, "stage1", 2)
        assert ref() is None, "the rft trainer is still alive next to the stage1 trainer"
        assert freed_while == [None], "the rft trainer was freed only after the stage1 trainer was built"
        assert ctx.trainer is new and ctx.trainer_stage == "stage1"
    finally:
        if gc_was_on:
            gc.enable()
        parallel.destroy()
        cpu_compat.disable()
