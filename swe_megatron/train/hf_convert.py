"""Hugging Face <-> Megatron-Core weights for Qwen2/Llama decoders, for any TP x PP layout.

Import: every rank fills its own shards straight from the HF tensors (`load_hf_state`). Export: every
rank turns its shards into HF-named pieces one parameter at a time, and the TP group gathers them on one
rank (`iter_hf_of_stage`), which `export.py` streams into safetensors shards of its pipeline stage.

Layouts that differ between the two (Megatron-Core 0.19, local or Transformer Engine spec):
- q/k/v: one `linear_qkv` whose rows are grouped per KV head: [q heads of group g, k_g, v_g] for each
  group g, split over TP in whole groups;
- gate/up: one `linear_fc1` whose TP shard r holds [gate rows of r; up rows of r];
- TE fuses the pre-attention/pre-MLP norms into `linear_qkv` / `linear_fc1` (`layer_norm_weight`);
- embedding and output layer rows are split over TP in contiguous vocabulary ranges.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from swe_megatron.config.schema import ModelConfig
from swe_megatron.model.hub import resolve_model_path

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# Megatron suffix inside a layer -> HF suffix inside `model.layers.{i}.`, for 1:1 tensors.
_LAYER_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
}


def _qkv_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return head_dim, cfg.num_attention_heads // cfg.num_key_value_heads, cfg.num_key_value_heads


def _qkv_to_megatron(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig, r: int, tp: int):
    """HF q/k/v (weights [out, H] or biases [out]) -> rank r's rows of Megatron's grouped linear_qkv."""
    d, per_group, groups = _qkv_sizes(cfg)
    tail = q.shape[1:]
    full = torch.cat(
        [q.reshape(groups, per_group * d, *tail), k.reshape(groups, d, *tail), v.reshape(groups, d, *tail)],
        dim=1,
    )
    g = groups // tp
    return full[r * g : (r + 1) * g].reshape(-1, *tail).clone()


def _qkv_to_hf(full: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron linear_qkv rows gathered over TP (in rank order) -> HF q, k, v."""
    d, per_group, groups = _qkv_sizes(cfg)
    tail = full.shape[1:]
    grouped = full.reshape(groups, (per_group + 2) * d, *tail)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (
        q.reshape(-1, *tail).contiguous(),
        k.reshape(-1, *tail).contiguous(),
        v.reshape(-1, *tail).contiguous(),
    )


def _chunk(t: torch.Tensor, r: int, tp: int, dim: int) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[r].clone()


def megatron_shard_from_hf(
    name: str, get: Callable[[str], torch.Tensor], cfg: ModelConfig, layer: int | None, r: int, tp: int
) -> torch.Tensor:
    """The TP-rank-r shard of Megatron parameter `name` (layer-local suffix when `layer` is set)."""
    if layer is None:
        if name == "embedding.word_embeddings.weight":
            return _chunk(get("model.embed_tokens.weight"), r, tp, 0)
        if name == "decoder.final_layernorm.weight":
            return get("model.norm.weight").clone()
        if name == "output_layer.weight":
            key = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
            return _chunk(get(key), r, tp, 0)
        raise KeyError(f"no HF tensor for Megatron parameter {name}")
    p = f"model.layers.{layer}."
    if name in _LAYER_DIRECT:
        return get(p + _LAYER_DIRECT[name]).clone()
    if name in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = name.rsplit(".", 1)[1]
        a = p + "self_attn."
        return _qkv_to_megatron(
            get(a + f"q_proj.{kind}"), get(a + f"k_proj.{kind}"), get(a + f"v_proj.{kind}"), cfg, r, tp
        )
    if name == "self_attention.linear_proj.weight":
        return _chunk(get(p + "self_attn.o_proj.weight"), r, tp, 1)
    if name == "mlp.linear_fc1.weight":
        return torch.cat(
            [
                _chunk(get(p + "mlp.gate_proj.weight"), r, tp, 0),
                _chunk(get(p + "mlp.up_proj.weight"), r, tp, 0),
            ]
        )
    if name == "mlp.linear_fc2.weight":
        return _chunk(get(p + "mlp.down_proj.weight"), r, tp, 1)
    raise KeyError(f"no HF tensor for Megatron parameter decoder.layers.*.{name}")


def hf_from_megatron_shards(
    name: str, shards: list[torch.Tensor], cfg: ModelConfig, layer: int | None
) -> dict[str, torch.Tensor]:
    """HF tensors from the TP shards (in TP-rank order) of Megatron parameter `name`."""
    if layer is None:
        if name == "embedding.word_embeddings.weight":
            return {"model.embed_tokens.weight": torch.cat(shards, 0)}
        if name == "decoder.final_layernorm.weight":
            return {"model.norm.weight": shards[0]}
        if name == "output_layer.weight":
            return {} if cfg.tie_word_embeddings else {"lm_head.weight": torch.cat(shards, 0)}
        raise KeyError(name)
    p = f"model.layers.{layer}."
    if name in _LAYER_DIRECT:
        return {p + _LAYER_DIRECT[name]: shards[0]}
    if name in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = name.rsplit(".", 1)[1]
        q, k, v = _qkv_to_hf(torch.cat(shards, 0), cfg)
        a = p + "self_attn."
        return {a + f"q_proj.{kind}": q, a + f"k_proj.{kind}": k, a + f"v_proj.{kind}": v}
    if name == "self_attention.linear_proj.weight":
        return {p + "self_attn.o_proj.weight": torch.cat(shards, 1)}
    if name == "mlp.linear_fc1.weight":
        halves = [s.chunk(2, 0) for s in shards]
        return {
            p + "mlp.gate_proj.weight": torch.cat([h[0] for h in halves], 0),
            p + "mlp.up_proj.weight": torch.cat([h[1] for h in halves], 0),
        }
    if name == "mlp.linear_fc2.weight":
        return {p + "mlp.down_proj.weight": torch.cat(shards, 1)}
    raise KeyError(name)


def _params(model) -> list[tuple[str, torch.nn.Parameter, int | None, str]]:
    """(full name, parameter, global 0-based layer or None, name used for mapping) of a GPTModel."""
    out = []
    for name, param in model.named_parameters():
        m = _LAYER.match(name)
        if m:
            global_layer = model.decoder.layers[int(m.group(1))].layer_number - 1
            out.append((name, param, global_layer, m.group(2)))
        else:
            out.append((name, param, None, name))
    return out


class HFCheckpoint(Mapping):
    """A Hugging Face safetensors folder as a read-on-demand mapping of HF names to tensors.

    `load_hf_state` asks only for the tensors of this rank's layers, so a 72B checkpoint is never held
    whole by one rank (a dict of every tensor would be ~145 GB per rank).
    """

    def __init__(self, folder):
        import json

        self.folder = resolve_model_path(folder)  # a folder, or a hub id in the local HF cache
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            self._where = json.loads(index.read_text())["weight_map"]
        else:
            from safetensors import safe_open

            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(
                    f"{self.folder}: no *.safetensors files (is it a HF checkpoint folder?)"
                )
            self._where = {}
            for f in files:
                with safe_open(str(self.folder / f), "pt") as h:
                    self._where.update(dict.fromkeys(h.keys(), f))

    def __getitem__(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.folder / self._where[key]), "pt") as h:
            return h.get_tensor(key)

    def __contains__(self, key) -> bool:
        return key in self._where  # without reading the tensor (Mapping's default would)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


@torch.no_grad()
def load_hf_state(
    model, hf: Mapping[str, torch.Tensor], cfg: ModelConfig, tp_rank: int, tp_size: int
) -> None:
    """Copy HF-named full tensors into this rank's shards of `model` (a GPTModel stage)."""

    def get(key: str) -> torch.Tensor:
        if key not in hf:
            raise KeyError(f"HF checkpoint lacks {key}: is it a {cfg.architecture} model of this shape?")
        return hf[key]

    for _, param, layer, name in _params(model):
        shard = megatron_shard_from_hf(name, get, cfg, layer, tp_rank, tp_size)
        if shard.shape != param.shape:
            raise ValueError(
                f"{name}: HF gives shard {tuple(shard.shape)}, model expects {tuple(param.shape)}"
            )
        param.copy_(shard.to(param.dtype))


def iter_hf_of_stage(model, cfg: ModelConfig, tp_group=None, grads: bool = False, dst: int | None = None):
    """Yield (HF name, full tensor) for the layers this pipeline stage holds, one Megatron parameter at a time.

    The tensors stay on the parameters' device and are gathered over `tp_group` as they are produced, so a
    consumer that streams them (export, weight sync) never holds more than one parameter's worth. Every
    rank of the TP group must drive the generator to the end, in lockstep. dst=None: every rank gathers and
    gets every tensor; dst=r: only TP-group rank r gathers them (the others send their shards and yield
    nothing), so no other rank ever holds a full tensor. Tied output weights are yielded once
    (embed_tokens). grads=True gives the gradients (Megatron DDP's `main_grad`) under the same names.
    """
    tp = dist.get_world_size(tp_group) if tp_group is not None else 1
    receiver = dst is None or tp == 1 or dist.get_rank(tp_group) == dst
    with torch.no_grad():
        for _, param, layer, name in _params(model):
            if name == "output_layer.weight" and cfg.tie_word_embeddings:
                continue
            local = (param.main_grad if grads else param).detach()
            if tp > 1 and getattr(param, "tensor_model_parallel", False):
                shards = [torch.empty_like(local) for _ in range(tp)] if receiver else None
                if dst is None:
                    dist.all_gather(shards, local.contiguous(), group=tp_group)
                else:
                    dist.gather(local.contiguous(), shards, group_dst=dst, group=tp_group)
            else:
                shards = [local] * tp
            if receiver:
                yield from hf_from_megatron_shards(name, shards, cfg, layer).items()
            elif (
                local.is_cuda
            ):  # NCCL's watchdog times a gather from its enqueue: one at a time, not all at once
                torch.cuda.current_stream(local.device).synchronize()


def hf_state_of_stage(model, cfg: ModelConfig, tp_group=None, grads: bool = False) -> dict[str, torch.Tensor]:
    """Full HF-named tensors (CPU copies) of the layers this pipeline stage holds; see `iter_hf_of_stage`."""
    return {k: v.cpu().clone() for k, v in iter_hf_of_stage(model, cfg, tp_group, grads)}
