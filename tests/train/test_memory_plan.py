"""The layout planner: a hand-computed small case, monotonicity, infeasible layouts flagged, the CLI."""

from __future__ import annotations

import pytest

from swe_megatron.config.schema import ModelConfig, Recompute
from swe_megatron.train.memory_plan import (
    GIB,
    SYNC_NCCL_GIB,
    estimate,
    plan_layouts,
    sync_working_bytes,
    total_params,
    valid_layouts,
)

SMALL = ModelConfig(
    vocab_size=256, hidden_size=64, intermediate_size=192, num_layers=2, num_attention_heads=4,
    num_key_value_heads=2, tie_word_embeddings=False, params_dtype="bfloat16",
)  # fmt: skip


SEVEN_B = ModelConfig(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_attention_heads=28,
    num_key_value_heads=4, params_dtype="bfloat16",
)  # fmt: skip


def test_small_case_by_hand():
    # Per layer: q/o 2 * 64*64, k/v 2 * 64*32, q/k/v bias 64+32+32, SwiGLU 3 * 64*192, two norms 2 * 64.
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 128 + 3 * 64 * 192 + 2 * 64
    assert per_layer == 49408
    params = 2 * per_layer + 2 * 256 * 64 + 64  # + embedding, output layer, final norm
    assert total_params(SMALL) == params == 131648
    x = estimate(
        SMALL, 128, 1, 1, 1, 1, recompute=Recompute.full, distributed_optimizer=False, overhead_gib=0
    )
    assert x.weights * GIB == pytest.approx(2 * params)
    assert x.grads * GIB == pytest.approx(4 * params)
    assert x.optimizer * GIB == pytest.approx(12 * params)
    # Full recompute: 2 layers x 128 tokens x 2h bytes of layer inputs; one layer rebuilt (x2 for grads)
    # at 10h + 4*kv*d + 8f = 2304 bytes/token; a 1024-row fp32 logits chunk (x2) and the final hidden states.
    kept = 2 * 128 * 2 * 64
    working = 2 * 128 * 2304
    logits = 1024 * 256 * 4 * 2 + 128 * 64 * 2
    # The row gather's gradient: a zero [128, 64] bf16 tensor the rows' gradients are added into, and its
    # contiguous copy for the reduce-scatter.
    row_gather_grad = 2 * 128 * 64 * 2
    assert x.activations * GIB == pytest.approx(kept + working + logits + row_gather_grad)
    # TP=2 halves the sharded parameters and (sequence parallel) the stored activations.
    y = estimate(
        SMALL, 128, 2, 1, 1, 1, recompute=Recompute.full, distributed_optimizer=False, overhead_gib=0
    )
    assert y.weights * GIB == pytest.approx(2 * params / 2)


def test_torch_adamw_holds_one_fp32_temporary_per_updated_parameter_instead_of_the_activations():
    """Megatron's fallback optimizer (no Transformer Engine, no Apex): torch's foreach AdamW, measured on an
    H200 at 1.5 GiB above the fused-Adam plan for a 3B model (tests/train/test_gpu.py)."""
    params = total_params(SEVEN_B)
    fused = estimate(SEVEN_B, 4096, 1, 1, 1, 2, distributed_optimizer=False, overhead_gib=0)
    assert fused.step_temp == 0
    assert fused.total == pytest.approx(fused.weights + fused.grads + fused.optimizer + fused.activations)
    torch_adam = estimate(
        SEVEN_B, 4096, 1, 1, 1, 2, distributed_optimizer=False, overhead_gib=1, fused_adam=False
    )
    assert torch_adam.step_temp * GIB == pytest.approx(4 * params)
    assert torch_adam.step_temp > torch_adam.activations
    steady = torch_adam.weights + torch_adam.grads + torch_adam.optimizer
    assert torch_adam.total == pytest.approx(steady + torch_adam.step_temp + 1)  # not activations + temp
    sharded = estimate(SEVEN_B, 4096, 1, 1, 1, 2, fused_adam=False)  # the distributed optimizer's shard
    assert sharded.step_temp * GIB == pytest.approx(4 * params / 2)
    kw = {"recompute": Recompute.none, "distributed_optimizer": False, "overhead_gib": 0, "fused_adam": False}
    long = estimate(SEVEN_B, 1 << 18, 1, 1, 1, 2, **kw)
    assert long.activations > long.step_temp
    assert long.total == pytest.approx(long.weights + long.grads + long.optimizer + long.activations)


def test_estimates_move_the_right_way():
    m = SEVEN_B
    base = estimate(m, 32768, 4, 1, 1, 4)
    assert estimate(m, 65536, 4, 1, 1, 4).activations > base.activations
    assert estimate(m, 65536, 4, 1, 2, 2).activations < estimate(m, 65536, 4, 1, 1, 4).activations
    assert estimate(m, 32768, 4, 1, 1, 8).optimizer < base.optimizer  # more DP shards Adam further
    assert estimate(m, 32768, 4, 1, 1, 4, distributed_optimizer=False).total > base.total
    assert estimate(m, 32768, 4, 2, 1, 2).weights < base.weights
    act = [estimate(m, 32768, 4, 1, 1, 4, recompute=r).activations for r in Recompute]
    assert act[2] < act[1] < act[0]  # full < selective < none


def test_layout_rules_and_infeasible_layouts_are_flagged():
    m72 = ModelConfig(
        vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_layers=80, num_attention_heads=64,
        num_key_value_heads=8, params_dtype="bfloat16",
    )  # fmt: skip
    for tp, pp, cp, dp in valid_layouts(m72, 131072, 64):
        assert tp * pp * cp * dp == 64 and tp <= 8 and 80 % pp == 0 and 8 % tp == 0
    # One node cannot hold 72B with Adam at 131k, whatever the layout.
    small = plan_layouts(m72, 131072, 8)
    assert small and not any(x.fits for x in small)
    many = plan_layouts(m72, 131072, 64)
    assert many[0].fits and not many[-1].fits
    assert [x.fits for x in many] == sorted((x.fits for x in many), reverse=True)


def test_plan_command_for_the_72b_preset(capsys):
    from swe_megatron.cli import main

    assert main(["plan", "--model", "paper-72b", "--context", "131072", "--gpus", "64", "--all"]) == 0
    out = capsys.readouterr().out
    assert "recommended: parallel.tensor_parallel=8" in out
    preset = [line for line in out.splitlines() if line.split()[:4] == ["8", "2", "4", "1"]]
    assert preset and preset[0].endswith("yes")  # configs/paper-72b.yaml's layout fits too
    assert main(["plan", "--model", "qwen2.5-72b-instruct", "--context", "131072", "--gpus", "8"]) == 1


def test_plan_estimates_both_weight_sync_methods_for_the_72b_preset(capsys):
    import re

    from swe_megatron.cli import main
    from swe_megatron.config.load import load_config

    flags = ["--fs-write-gbps", "8", "--fs-read-gbps", "32", "--nic-gbps", "25"]
    assert main(["plan", "--model", "paper-72b", "--context", "131072", "--gpus", "64", *flags]) == 0
    out = capsys.readouterr().out
    cfg = load_config("paper-72b")
    gb = 2 * total_params(cfg.model) / 1e9  # bf16
    servers, pp = cfg.engine.num_servers, cfg.parallel.pipeline_parallel
    assert servers == 16 and f"{gb:.1f} GB of weights" in out

    def seconds(method: str) -> float:
        (line,) = [x for x in out.splitlines() if x.strip().startswith(f"{method}:")]
        return float(re.search(r"-> ([0-9.]+) s$", line).group(1))

    assert seconds("file") == pytest.approx(gb / 8 + servers * gb / 32, abs=0.06)  # 18.2 + 72.7 s
    assert seconds("broadcast") == pytest.approx(gb * (pp - 1) / pp / 25 + gb / 25, abs=0.06)  # 5.8 s


def test_the_row_gather_gradient_is_full_length_whatever_the_tensor_parallelism():
    """Sequence parallelism gathers the whole sequence before the logprob head: its gradient does not shrink with
    TP, only with CP (each CP rank holds context / CP tokens)."""
    base = estimate(SMALL, 4096, 1, 1, 1, 1, recompute=Recompute.none, overhead_gib=0)
    wide = estimate(SMALL, 8192, 1, 1, 1, 1, recompute=Recompute.none, overhead_gib=0)
    layer = 2 * 4096 * (10 * 64 + 4 * 2 * 16 + 8 * 192)  # 2 layers kept, 4096 more tokens
    assert (wide.activations - base.activations) * GIB == pytest.approx(
        layer + 4096 * 64 * 2 + 2 * 4096 * 64 * 2
    )
    m = SEVEN_B
    tp1, tp4 = (estimate(m, 32768, tp, 1, 1, 1, recompute=Recompute.full, overhead_gib=0) for tp in (1, 4))
    kept = 28 * 32768 * 2 * m.hidden_size
    working = 2 * 32768 * (10 * m.hidden_size + 4 * 4 * 128 + 8 * m.intermediate_size)
    head = 1024 * m.vocab_size * 4 * 2 + 32768 * m.hidden_size * 2 + 2 * 32768 * m.hidden_size * 2
    assert tp1.activations * GIB == pytest.approx(kept + working + head)
    head4 = 1024 * m.vocab_size / 4 * 4 * 2 + 32768 * m.hidden_size * 2 + 2 * 32768 * m.hidden_size * 2
    assert tp4.activations * GIB == pytest.approx((kept + working) / 4 + head4)


def test_the_weight_sync_working_set_is_held_after_the_step_not_beside_the_activations():
    """Rank 0 during a broadcast sync: the largest HF tensor gathered whole (SEVEN_B: the vocab x hidden embedding),
    one bucket and its torch.cat source, the sync group's NCCL buffers; the file method only the gathered tensor."""
    embed = 152064 * 3584 * 2
    assert sync_working_bytes(SEVEN_B, "file") == embed
    assert sync_working_bytes(SEVEN_B, "broadcast", 256.0) == embed + 2 * 256 * 2**20 + SYNC_NCCL_GIB * GIB
    wide_mlp = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=4096, num_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, params_dtype="float32")  # fmt: skip
    assert sync_working_bytes(wide_mlp, "file") == 2 * 4096 * 64 * 4  # the fused gate/up projection, fp32
    sync = sync_working_bytes(SEVEN_B)
    small = estimate(SEVEN_B, 1024, 1, 1, 1, 2, overhead_gib=0, sync_bytes=sync)
    assert small.sync * GIB == sync > small.activations * GIB
    assert small.total == pytest.approx(small.weights + small.grads + small.optimizer + small.sync)
    big = estimate(SEVEN_B, 32768, 1, 1, 1, 2, overhead_gib=0, sync_bytes=sync)
    assert big.total == pytest.approx(big.weights + big.grads + big.optimizer + big.activations)


def test_plan_states_the_checkpoint_size_write_time_and_the_paper_presets_live_footprint(capsys):
    import re

    from swe_megatron.cli import main
    from swe_megatron.config.load import find_preset, load_config

    assert main(["plan", "paper-72b", "--fs-write-gbps", "5"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("checkpoint per committed unit")]
    cfg = load_config("paper-72b")
    n = total_params(cfg.model)
    unit = n * (2 + 12 + 2) / 1e12  # bf16 weights, fp32 master + 2 moments, bf16 HF export
    assert f"= {unit:.2f} TB, written at 5 GB/s" in line
    assert float(re.search(r"= (\d+) s;", line).group(1)) == pytest.approx(unit * 1e12 / 5e9, abs=0.5)
    keep = cfg.checkpoint.keep_last
    live = float(re.search(r"being written = ([0-9.]+) TB", line).group(1))
    assert live == pytest.approx((keep + 1) * unit, abs=0.006)
    # the preset states the footprint the plan computes (at the default 10 GB/s)
    text = find_preset("paper-72b").read_text()
    assert (
        f"keep_last {keep} holds {live:.2f} TB live" in text and f"{unit:.2f} TB, ~{unit * 100:.0f} s" in text
    )


def test_plan_of_a_run_preset_shows_and_marks_the_presets_own_layout(capsys):
    """paper-7b's own layout (TP 4, PP 1, CP 4 on 16 GPUs) ranks below the top rows: it is shown anyway, marked,
    and a line says whether it fits; a layout given with --gpus that the preset's does not match says so."""
    from swe_megatron.cli import main

    assert main(["plan", "paper-7b"]) == 0
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if line.endswith("<- the preset's")]
    assert len(marked) == 1 and marked[0].split()[:4] == ["4", "1", "4", "1"], out
    assert "the preset's layout (paper-7b: TP 4, PP 1, CP 4, DP 1 on 16 GPUs): " in out, out
    assert main(["plan", "paper-7b", "--gpus", "12"]) == 0
    out = capsys.readouterr().out
    assert "<- the preset's" not in out and "the preset's layout" in out and "is not one of these" in out, out
