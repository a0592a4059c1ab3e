"""Where trainer and engines find a model: a folder, or a hub id resolved offline through a Hugging Face cache
laid out as the hub client lays it out; and the folder an engine starts from carries the trainer's config."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swe_megatron.config.schema import ModelConfig, RopeScalingConfig
from swe_megatron.engine.vllm_server import engine_model_dir
from swe_megatron.errors import UsageError
from swe_megatron.model.hf_config import hf_config_dict
from swe_megatron.model.tiny import save_tiny_checkpoint

TINY = ModelConfig(num_layers=1, num_attention_heads=2, num_key_value_heads=1)
YARN = ModelConfig(
    num_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32768,
    rope_scaling=RopeScalingConfig("yarn", 4.0, 32768),
)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo_id: str, folder: Path) -> Path:
    """`folder` stored as huggingface_hub stores a download: blobs/ named by content hash, refs/main holding
    the commit, snapshots/<commit>/<file> relative symlinks into blobs/ (file_download.py's layout)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)  # no trailing newline, as the client writes it
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for f in sorted(folder.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    return snap


def offline_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


# Run in a fresh interpreter: huggingface_hub reads HF_HUB_CACHE / HF_HOME when it is imported.
PROBE = """
import json, sys
from swe_megatron.config.schema import ModelConfig, RopeScalingConfig
from swe_megatron.engine.vllm_server import engine_model_dir
from swe_megatron.model.hub import ModelNotFoundError, resolve_model_path
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.train.hf_convert import HFCheckpoint

repo, out = sys.argv[1], sys.argv[2]
ckpt = HFCheckpoint(repo)
model = ModelConfig(hf_path=repo, num_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    rope_scaling=RopeScalingConfig("yarn", 4.0, 32768))
served = engine_model_dir(model, out)
try:
    resolve_model_path("Nobody/missing-model")
    missing = None
except ModelNotFoundError as e:
    missing = str(e)
print(json.dumps({
    "folder": str(ckpt.folder),
    "embed": list(ckpt["model.embed_tokens.weight"].shape),
    "eos": load_tokenizer(repo).convert_tokens_to_ids("<|im_end|>"),
    "served": str(served),
    "missing": missing,
}))
"""


def test_hub_id_resolves_through_the_offline_cache_for_trainer_tokenizer_and_engine(tmp_path):
    snap = hub_cache(tmp_path / "hub", "Org/Tiny-Model", save_tiny_checkpoint(TINY, tmp_path / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "Org/Tiny-Model", str(tmp_path / "engine")],
        env=offline_env(tmp_path / "hub"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(got["folder"]) == snap
    assert got["embed"] == [TINY.vocab_size, TINY.hidden_size] and got["eos"] == 151645
    served = Path(got["served"])
    assert (served / "model.safetensors").resolve().parent.name == "blobs"  # the cached weights, not a copy
    assert json.loads((served / "config.json").read_text())["rope_scaling"]["factor"] == 4.0
    # One message naming the id and the cache, and what to do.
    assert "'Nobody/missing-model'" in got["missing"] and str(tmp_path / "hub") in got["missing"]
    assert "hf download" in got["missing"] and "\n" not in got["missing"]


def test_engine_folder_has_the_trainers_config_not_the_base_models(tmp_path):
    base = save_tiny_checkpoint(TINY, tmp_path / "base")  # a base model: no rope scaling, 32768 positions
    served = engine_model_dir(YARN, tmp_path / "engine", base)
    config = json.loads((served / "config.json").read_text())
    assert config == hf_config_dict(YARN, {"bos_token_id": None, "eos_token_id": 151645})  # tokenizer's ids
    assert config["max_position_embeddings"] == 4 * 32768 and config["rope_scaling"]["type"] == "yarn"
    assert (
        json.loads((base / "config.json").read_text()).get("rope_scaling") is None
    )  # the source is untouched
    assert {p.name for p in served.iterdir()} == {p.name for p in base.iterdir()}
    assert (served / "model.safetensors").resolve() == (base / "model.safetensors").resolve()
    # Idempotent on a restart (a requeued job), and a missing folder is one clear error.
    assert (
        engine_model_dir(YARN, tmp_path / "engine", base) == served and not (tmp_path / "engine.tmp").exists()
    )
    with pytest.raises(UsageError, match="does not exist"):  # the CLI prints it as one line
        engine_model_dir(YARN, tmp_path / "engine", tmp_path / "nowhere")


def test_slurm_jobs_bind_the_hugging_face_cache_into_the_image(tmp_path):
    """slurm/common.sh runs every step (engine, trainer) in the image with HF_HUB_CACHE / HF_HOME bound."""
    repo = Path(__file__).resolve().parents[2]
    image, hub = tmp_path / "trainer.sif", tmp_path / "hub"
    image.touch()
    hub.mkdir()
    fake = repo / "tests" / "fake_apptainer"
    env = {**offline_env(hub), "SLURM_JOB_ID": "1", "SWE_MEGATRON_REPO": str(repo),
           "SWE_MEGATRON_IMAGE": str(image), "PATH": f"{fake}:{os.environ['PATH']}"}  # fmt: skip
    out = subprocess.run(
        ["bash", "-c", 'source slurm/common.sh && _sm_setup && printf "%s\\n" "${SM[@]}"'],
        cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[out.index("--bind") + 1] == f"{repo},{hub}"
