"""In-process transformers engine, only for fast unit tests (tiny checkpoints: model/tiny.py).

Sampling is done here (not with `model.generate`, whose defaults include top-k 50): plain multinomial
sampling from the temperature-1 softmax, with the KV cache, returning each sampled id's logprob.
"""

from __future__ import annotations

import torch

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
