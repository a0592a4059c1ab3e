"""In-process transformers engine, only for fast unit tests; and tiny random Qwen2 checkpoints for tests.

Sampling is done here (not with `model.generate`, whose defaults include top-k 50): plain multinomial
sampling from the temperature-1 softmax, with the KV cache, returning each sampled id's logprob.
"""

from __future__ import annotations

from pathlib import Path

import torch

from swe_megatron.config.schema import ModelConfig
from swe_megatron.engine.base import Generation


class TransformersEngine:
    """A Hugging Face causal LM sampled on CPU; one process, no servers, deterministic under a seed."""

    def __init__(self, model, eos_id: int, seed: int = 0):
        self.model = model.eval()
        self.eos_id = eos_id
        self.gen = torch.Generator().manual_seed(seed)

    @classmethod
    def from_pretrained(cls, path: str, eos_id: int, seed: int = 0) -> TransformersEngine:
        """Load a checkpoint folder in fp32."""
        from transformers import AutoModelForCausalLM

        return cls(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), eos_id, seed)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_tokens: int, session: str = "") -> Generation:
        """Sample until the end-of-turn token or max_tokens."""
        ids, lps = [], []
        inp = torch.tensor([prompt_ids])
        past = None
        for _ in range(max_tokens):
            out = self.model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
            if tok == self.eos_id:
                return Generation(ids, lps, "stop")
            inp = torch.tensor([[tok]])
        return Generation(ids, lps, "length")

    def end_session(self, session: str) -> None:
        """No routing to forget."""

    def reload_weights(self, path: str) -> None:
        """Load weights from a checkpoint folder into the model in place."""
        from transformers import AutoModelForCausalLM

        new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.load_state_dict(new.state_dict())


def tiny_qwen2(cfg: ModelConfig, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM of cfg's shape (real vocabulary size)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    from swe_megatron.train.export import hf_config_dict  # one ModelConfig -> HF config mapping

    fields = {k: v for k, v in hf_config_dict(cfg).items() if k != "model_type"}
    hf_cfg = Qwen2Config(**fields, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    return Qwen2ForCausalLM(hf_cfg).float().eval()


def save_tiny_checkpoint(cfg: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """A tiny random checkpoint folder vLLM can serve: weights (safetensors), config and tokenizer."""
    from swe_megatron.model.tokenizer import save_tokenizer

    out = Path(out_dir)
    tiny_qwen2(cfg, seed).save_pretrained(str(out))
    save_tokenizer(cfg.tokenizer, out)
    return out
