"""GPU-only choices of train/model.py, checked on CPU by making torch report CUDA.

The local layer spec's attention (DotProductAttention -> FusedScaleMaskSoftmax) imports Megatron's
legacy softmax kernels (`scaled_masked_softmax_cuda`, `scaled_upper_triang_masked_softmax_cuda`) when
`masked_softmax_fusion` is on and the input is bf16/fp16. Neither the megatron-core wheel nor
Transformer Engine ships them (apex or Megatron-LM's JIT build does), so on a GPU without them a bf16
local-spec forward must take the PyTorch softmax instead of failing with ModuleNotFoundError.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from swe_megatron.config.schema import ModelConfig, ParallelConfig, TransformerImpl
from swe_megatron.train.model import transformer_config


def test_bf16_local_softmax_on_gpu_does_not_need_absent_fused_kernels(monkeypatch):
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType

    have = all(
        importlib.util.find_spec(m) is not None
        for m in ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda")
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    model = dataclasses.replace(ModelConfig(), params_dtype="bfloat16")
    cfg = transformer_config(model, ParallelConfig(transformer_impl=TransformerImpl.local))
    assert cfg.masked_softmax_fusion == have
    softmax = FusedScaleMaskSoftmax(
        input_in_fp16=False,
        input_in_bf16=True,
        attn_mask_type=AttnMaskType.causal,
        scaled_masked_softmax_fusion=cfg.masked_softmax_fusion,
        mask_func=lambda scores, mask: scores.masked_fill(mask, -10000.0),
        softmax_in_fp32=True,
        scale=None,
    )
    # The shape check DotProductAttention runs on every forward (b=1, 4 heads, 64 x 64 scores).
    assert softmax.is_kernel_available(None, 1, model.num_attention_heads, 64, 64) == have
