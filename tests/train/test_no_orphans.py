"""No process the trainer starts outlives it: a checkpoint save leaves no helper behind a SIGKILLed driver.

megatron-core 0.19.2's dist_checkpointing writer (FileSystemWriterAsync, also used by synchronous saves)
collects its results through `multiprocessing.Manager().Queue()`: a spawned server process that stays for
the life of the saving process and does not notice its parent's death. After `kill -9` of the driver it
was still running 30 minutes later (issue 13 item 11).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from procs import alive, cmdline, descendants

_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from swe_megatron.config.schema import ModelConfig, OptimConfig, ParallelConfig
    from swe_megatron.train import parallel
    from swe_megatron.train.step import Trainer

    out = Path(sys.argv[1])
    parallel.init_distributed(0, 1, master_port=parallel.free_port())
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    cfg = ModelConfig(name="t", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    trainer = Trainer(cfg, par, OptimConfig(), total_steps=1)
    trainer.save(str(out / "ckpt"))
    (out / "saved").write_text("ok")
    time.sleep(600)
    """
)


def test_sigkilled_driver_leaves_no_checkpoint_helper(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, cwd=tmp_path)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "saved").exists():
            assert proc.poll() is None, f"the saving process exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the save did not finish in 300 s"
            seen |= descendants(proc.pid)
            time.sleep(0.2)
        seen |= descendants(proc.pid)
        print(f"descendants of the saving process: {sorted(seen)}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(3)
        left = sorted(p for p in seen if alive(p))
        assert not left, f"still running after the saver was SIGKILLed: {[cmdline(p)[:120] for p in left]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in seen:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_save_writes_a_loadable_checkpoint_without_a_helper(tmp_path, megatron_world):
    """The thread queue serves the synchronous save: the checkpoint loads back and no child was started."""
    import multiprocessing

    import torch

    from swe_megatron.config.schema import ModelConfig, OptimConfig, ParallelConfig
    from swe_megatron.train import parallel
    from swe_megatron.train.step import Trainer

    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    cfg = ModelConfig(name="t", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    a = Trainer(cfg, par, OptimConfig(), total_steps=1)
    a.save(str(tmp_path / "ckpt"))
    assert not multiprocessing.active_children()
    parallel.init_model_parallel(par, seed=2)
    b = Trainer(cfg, par, OptimConfig(), total_steps=1)
    b.load(str(tmp_path / "ckpt"))
    for (name, pa), (_, pb) in zip(a.model.module.named_parameters(), b.model.module.named_parameters()):
        assert torch.equal(pa, pb), name
