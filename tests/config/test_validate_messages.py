"""config/validate.py, fast: each check's exact message (the key, its value, what is allowed) and its edges, on
the embedded preset merged with a few keys and validated directly (milliseconds; load_config's own path is
tests/config/test_config.py's)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from omegaconf import OmegaConf

from swe_megatron.config.load import load_config
from swe_megatron.config.schema import SandboxConfig
from swe_megatron.config.validate import sandbox_problems, validate

CTX = (
    "(max_position_embeddings, or rope_scaling.factor x original_max_position_embeddings with yarn; "
    "set model.rope_scaling for longer context)"
)
AGENT = (
    "are invalid; allowed: concurrency >= 1 (0: derived from the cluster), infra_retries >= 0, "
    "prewarm_sandboxes >= 0 (-1: derived from the spare sandbox slots)"
)
DEADLINE = "is invalid; allowed: 0 (no limit) or more than the agent's own commands can take,"


@pytest.fixture(scope="module")
def base():
    return load_config("embedded")


def problems(base, *overrides: str) -> list[str]:
    return validate(OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides))))


def test_the_preset_is_valid(base):
    assert validate(base) == []


@pytest.mark.parametrize(
    ("overrides", "messages"),
    [
        (["stage1.eps_low=0"], ["stage1.eps_low=0.0 is invalid; allowed: 0 < eps_low < 1 (the paper: 0.2)"]),
        (
            ["stage1.eps_high=0"],
            ["stage1.eps_high=0.0 is invalid; allowed: eps_high > 0 (the paper: 0.3 / 0.26)"],
        ),
        (
            ["stage1.t_max=0"],
            [
                "stage1.t_max=0 is invalid; allowed: an integer >= 1 turns",
                "stage1.l_thr=3 is invalid; allowed: 0 <= l_thr < t_max (0)",
            ],
        ),
        (["stage1.l_thr=-1"], ["stage1.l_thr=-1 is invalid; allowed: 0 <= l_thr < t_max (5)"]),
        (["stage1.l_thr=5"], ["stage1.l_thr=5 is invalid; allowed: 0 <= l_thr < t_max (5)"]),
        (["stage2.batch_size=0"], ["stage2.batch_size=0 is invalid; allowed: an integer >= 1"]),
        (["rft.iterations=0"], ["rft.iterations=0 is invalid; allowed: an integer >= 1"]),
        (
            ["stage1.samples_per_task=1"],
            ["stage1.samples_per_task=1 is invalid for DAPO; allowed: >= 2 (group advantages)"],
        ),
        (
            ["stage1.min_optimizer_steps=0"],
            [
                "stage1.min_optimizer_steps=0 / max_optimizer_steps=8 are invalid; allowed: 1 <= min_optimizer_steps "
                "<= max_optimizer_steps, or max 0 for no cap (the paper: 2, 8)"
            ],
        ),
        (
            ["stage1.min_optimizer_steps=3", "stage1.max_optimizer_steps=2"],
            [
                "stage1.min_optimizer_steps=3 / max_optimizer_steps=2 are invalid; allowed: 1 <= min_optimizer_steps "
                "<= max_optimizer_steps, or max 0 for no cap (the paper: 2, 8)"
            ],
        ),
        (
            ["stage1.context_length=0"],
            [f"stage1.context_length=0 is invalid; allowed: 1..32768 for model tiny-qwen2 {CTX}"],
        ),
        (
            ["stage1.context_length=32769"],
            [f"stage1.context_length=32769 is invalid; allowed: 1..32768 for model tiny-qwen2 {CTX}"],
        ),
        (
            ["stage1.refresh_max_solve_rate=0"],
            ["stage1.refresh_max_solve_rate=0.0 is invalid; allowed: 0 < rate <= 1"],
        ),
        (
            ["stage1.refresh_max_solve_rate=1.01"],
            ["stage1.refresh_max_solve_rate=1.01 is invalid; allowed: 0 < rate <= 1"],
        ),
        (["rft.warm_start_lr=-1"], ["rft.warm_start_lr=-1.0 is invalid; allowed: >= 0 (0 uses optim.lr)"]),
        (["rft.warm_start_decoys=-1"], ["rft.warm_start_decoys=-1 is invalid; allowed: >= 0"]),
        (["rft.warm_start_epochs=-1"], ["rft.warm_start_epochs=-1 is invalid; allowed: >= 0 (the most epochs)"]),
        (["rft.warm_start_anneal_epochs=-1"],
         ["rft.warm_start_anneal_epochs=-1 is invalid; allowed: >= 0 (0: none)"]),
        (["rft.warm_start_loss_target=-0.1"],
         ["rft.warm_start_loss_target=-0.1 is invalid; allowed: >= 0 (0: no target)"]),
        (
            ["stage1.optim.lr=0"],
            ["stage1.optim.lr=0.0 / min_lr=0.0 are invalid; allowed: lr > 0 and 0 <= min_lr <= lr"],
        ),
        (
            ["stage1.optim.min_lr=-1"],
            ["stage1.optim.lr=0.0004 / min_lr=-1.0 are invalid; allowed: lr > 0 and 0 <= min_lr <= lr"],
        ),
        (
            ["stage1.optim.min_lr=0.0005"],
            ["stage1.optim.lr=0.0004 / min_lr=0.0005 are invalid; allowed: lr > 0 and 0 <= min_lr <= lr"],
        ),
        (
            ["stage1.optim.betas=[0.9,1.0]"],
            ["stage1.optim.betas=[0.9, 1.0] is invalid; allowed: two values in [0, 1), e.g. [0.9, 0.999]"],
        ),
        (
            ["stage1.optim.betas=[-0.1,0.9]"],
            ["stage1.optim.betas=[-0.1, 0.9] is invalid; allowed: two values in [0, 1), e.g. [0.9, 0.999]"],
        ),
        (
            ["stage1.optim.betas=[0.9]"],
            ["stage1.optim.betas=[0.9] is invalid; allowed: two values in [0, 1), e.g. [0.9, 0.999]"],
        ),
        *(
            (
                [f"stage1.optim.{k}={v}"],
                ["stage1.optim: eps must be > 0 and weight_decay, grad_clip, warmup_steps >= 0"],
            )
            for k, v in (("eps", 0), ("weight_decay", -1), ("grad_clip", -1), ("warmup_steps", -1))
        ),
        (
            ["schedule=[]"],
            ["schedule=[] is invalid (nothing to run); allowed: a list of rft, stage1, stage2, eval"],
        ),
        (
            ["schedule=[rft,rft]"],
            ["schedule=['rft', 'rft'] repeats a stage; allowed: each of rft, stage1, stage2, eval once"],
        ),
        (["schedule=[rft,x]"], ["schedule entry 'x' is invalid; allowed: rft, stage1, stage2, eval"]),
        (["model.architecture=gpt"], ["model.architecture='gpt' is invalid; allowed: qwen2, llama"]),
        (["model.architecture=llama"], []),
        (
            ["model.hidden_size=63"],
            [
                "model: hidden_size (63) must be divisible by num_attention_heads (2), and that by "
                "num_key_value_heads (1)"
            ],
        ),
        *(
            (
                [f"model.{k}={v}"],
                [
                    f"model.num_attention_heads={v if k == 'num_attention_heads' else 2} / model.num_key_value_heads="
                    f"{v if k == 'num_key_value_heads' else 1} are invalid; allowed: integers >= 1"
                ],
            )
            for k in ("num_attention_heads", "num_key_value_heads")
            for v in (0, -2)
        ),
        (
            ["model.num_key_value_heads=3"],
            [
                "model: hidden_size (64) must be divisible by num_attention_heads (2), and that by "
                "num_key_value_heads (3)"
            ],
        ),
        (
            ["model.rope_scaling.type=linear"],
            [
                "model.rope_scaling.type='linear' is not implemented by the trainer; allowed: null, yarn "
                "(the engines would apply a scaling the trainer does not)"
            ],
        ),
        (
            ["model.rope_scaling.factor=2.0"],
            [
                "model.rope_scaling.factor=2.0 has no effect without a scaling type; allowed: 1.0, or set "
                "model.rope_scaling.type=yarn"
            ],
        ),
        (
            ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=1.0"],
            [
                "model.rope_scaling.factor=1.0 / original_max_position_embeddings=32768 are invalid for yarn; "
                "allowed: factor > 1 (the paper: 4.0), original_max_position_embeddings >= 1"
            ],
        ),
        (
            [
                "model.rope_scaling.type=yarn",
                "model.rope_scaling.factor=1.01",
                "model.rope_scaling.original_max_position_embeddings=8192",
            ],
            [],
        ),
        (
            [
                "model.rope_scaling.type=yarn",
                "model.rope_scaling.factor=8193",
                "model.rope_scaling.original_max_position_embeddings=1",
            ],
            [],
        ),
        (
            [
                "model.rope_scaling.type=yarn",
                "model.rope_scaling.factor=2.0",
                "model.rope_scaling.original_max_position_embeddings=0",
                "schedule=[eval]",
            ],
            [
                "model.rope_scaling.factor=2.0 / original_max_position_embeddings=0 are invalid for yarn; "
                "allowed: factor > 1 (the paper: 4.0), original_max_position_embeddings >= 1"
            ],
        ),
        (
            ["model.params_dtype=int8"],
            ["model.params_dtype='int8' is invalid; allowed: float32, bfloat16, float16"],
        ),
        (["model.params_dtype=float16"], []),
        (
            ["sampling.top_p=0.9"],
            [
                "sampling.top_p=0.9 is not allowed with RL stages (stage1, stage2); allowed: 1.0 (untruncated "
                "sampling keeps the importance ratio unbiased)"
            ],
        ),
        (
            ["schedule=[eval,stage2]", "sampling.repetition_penalty=1.1"],
            [
                "sampling.repetition_penalty=1.1 is not allowed with RL stages (stage2); allowed: 1.0 (untruncated "
                "sampling keeps the importance ratio unbiased)"
            ],
        ),
        (["schedule=[rft,eval]", "sampling.top_p=0.9"], []),
        (
            ["schedule=[rft,eval]", "sampling.temperature=0"],
            ["sampling: temperature must be > 0 and max_tokens_per_turn >= 1"],
        ),
        (
            ["sampling.max_tokens_per_turn=0"],
            ["sampling: temperature must be > 0 and max_tokens_per_turn >= 1"],
        ),
        (["sampling.max_tokens_per_turn=1"], []),
        (
            ["algo.adv_eps=-1"],
            [
                "algo.adv_eps=-1.0 / oversample_factor=1.0 are invalid; allowed: adv_eps >= 0, oversample_factor >= 1.0"
            ],
        ),
        (
            ["algo.oversample_factor=0.99"],
            [
                "algo.adv_eps=1e-06 / oversample_factor=0.99 are invalid; allowed: adv_eps >= 0, "
                "oversample_factor >= 1.0"
            ],
        ),
        (["algo.adv_eps=0", "algo.oversample_factor=1.0"], []),
        (["algo.max_staleness=15"], []),  # V1: both edges of 0..MAX_STALENESS are allowed
        (["algo.max_staleness=0"], []),
        (["engine.weight_sync_port=65535"], []),  # V3: the last port, and 0 (any free port)
        (["engine.weight_sync_port=0"], []),
        (["engine.port=0"], []),  # 0: any free port (issue 42 item 2), as sandbox-server --port 0
        (["engine.port=65534", "engine.num_servers=2"], []),  # the last server on the last port
        (
            ["engine.port=65535", "engine.num_servers=2"],
            [
                "engine.port=65535 is invalid; allowed: 0 (any free port) .. 65534 (server i listens on "
                "engine.port + i, engine.num_servers=2)"
            ],
        ),
        (
            ["engine.port=-1"],
            [
                "engine.port=-1 is invalid; allowed: 0 (any free port) .. 65535 (server i listens on "
                "engine.port + i, engine.num_servers=1)"
            ],
        ),
        (
            ["algo.max_staleness=16"],
            [
                "algo.max_staleness=16 is invalid; allowed: 0 (synchronous, the paper) or 1..15 (rollouts run up "
                "to k iterations ahead of the trainer)"
            ],
        ),
        (
            ["algo.off_policy.mask_threshold=.inf"],
            ["algo.off_policy.mask_threshold=inf is invalid; allowed: null (off) or a finite number > 0"],
        ),
        (["algo.off_policy.mask_threshold=0.5", "algo.off_policy.tis_cap=2.0"], []),
        *(
            ([f"parallel.{k}=0"], [f"parallel.{k}=0 is invalid; allowed: an integer >= 1"])
            for k in ("pipeline_parallel", "context_parallel")
        ),
        (["parallel.world_size=0"], ["parallel.world_size=0 is invalid; allowed: an integer >= 1"]),
        (
            ["parallel.tensor_parallel=0"],
            ["parallel.tensor_parallel=0 is invalid; allowed: an integer >= 1"],
        ),
        (
            ["parallel.world_size=3", "parallel.pipeline_parallel=2"],
            [
                "parallel.world_size=3 is invalid; allowed: a multiple of tensor x pipeline x context parallel (2)"
            ],
        ),
        (["parallel.world_size=4", "parallel.pipeline_parallel=2", "parallel.context_parallel=2"], []),
        (
            [
                "parallel.world_size=2",
                "parallel.tensor_parallel=2",
                "model.num_key_value_heads=1",
                "model.num_attention_heads=2",
            ],
            [
                "parallel.tensor_parallel=2 does not divide model.num_key_value_heads (1); allowed: a divisor of it"
            ],
        ),
        (
            [
                "parallel.world_size=2",
                "parallel.tensor_parallel=2",
                "model.num_key_value_heads=2",
                "parallel.sequence_parallel=true",
            ],
            [],
        ),
        (
            ["parallel.sequence_parallel=true"],
            ["parallel.sequence_parallel=true needs tensor_parallel > 1; allowed: false with TP=1"],
        ),
        (
            ["parallel.micro_batch_tokens=0"],
            ["parallel.micro_batch_tokens=0 is invalid; allowed: an integer >= 1"],
        ),
        (["parallel.micro_batch_tokens=1"], []),
        (["sandbox.backend=local", "sandbox.allow_local=true"], []),
        (["engine.weight_sync=nccl"], ["engine.weight_sync='nccl' is invalid; allowed: file, broadcast"]),
        (["engine.weight_sync=broadcast"], []),
        (
            ["engine.weight_sync_bucket_mb=0"],
            ["engine.weight_sync_bucket_mb=0.0 is invalid; allowed: > 0 (finite)"],
        ),
        (
            ["engine.weight_sync_timeout_s=.inf"],
            ["engine.weight_sync_timeout_s=inf is invalid; allowed: > 0 (finite)"],
        ),
        (
            ["engine.weight_sync_port=-1"],
            ["engine.weight_sync_port=-1 is invalid; allowed: 0 (any free port) .. 65535"],
        ),
        (
            ["cluster.gpus_per_node=1", "engine.weight_sync=broadcast"],
            [
                "cluster.engine_nodes=0 with GPUs (cluster.gpus_per_node > 0) and engine.weight_sync=broadcast is "
                "invalid: the run's own vLLM server would share trainer rank 0's GPU and sit in its NCCL sync group "
                "twice; allowed: cluster.engine_nodes >= 1 (vLLM on its own nodes) or engine.weight_sync=file"
            ],
        ),
        (["cluster.gpus_per_node=1", "engine.weight_sync=file"], []),
        (
            [
                "cluster.nodes=2",
                "cluster.engine_nodes=1",
                "cluster.gpus_per_node=1",
                "engine.weight_sync=broadcast",
            ],
            [],
        ),
        (
            ["cluster.trainer_nodes=0"],
            ["cluster.trainer_nodes (0) + engine_nodes (0) must be between 1 and cluster.nodes (1)"],
        ),
        (["cluster.nodes=3", "cluster.trainer_nodes=2", "cluster.engine_nodes=1"], []),
        (
            ["cluster.nodes=3", "cluster.trainer_nodes=2", "cluster.engine_nodes=2"],
            ["cluster.trainer_nodes (2) + engine_nodes (2) must be between 1 and cluster.nodes (3)"],
        ),
        (
            [
                "cluster.gpus_per_node=1",
                "cluster.nodes=2",
                "cluster.trainer_nodes=2",
                "parallel.world_size=3",
            ],
            ["parallel.world_size=3 exceeds the trainer's GPUs (cluster.trainer_nodes x gpus_per_node = 2)"],
        ),
        (
            [
                "cluster.gpus_per_node=1",
                "cluster.nodes=2",
                "cluster.trainer_nodes=2",
                "parallel.world_size=2",
            ],
            [],
        ),
        (["agent.concurrency=-1"], [f"agent.concurrency=-1 / infra_retries=2 / prewarm_sandboxes=2 {AGENT}"]),
        (
            ["agent.infra_retries=-1"],
            [f"agent.concurrency=4 / infra_retries=-1 / prewarm_sandboxes=2 {AGENT}"],
        ),
        (
            ["agent.prewarm_sandboxes=-2"],
            [f"agent.concurrency=4 / infra_retries=2 / prewarm_sandboxes=-2 {AGENT}"],
        ),
        (["agent.concurrency=1", "agent.infra_retries=0", "agent.prewarm_sandboxes=0"], []),
        (
            ["agent.concurrency=5"],
            [
                "agent.concurrency=5 is invalid; allowed: at most sandbox.max_concurrent x cluster.nodes (4 x 1 = 4): "
                "each running episode needs a sandbox slot, and an episode finding none waits, then is refused (an "
                "infrastructure failure); agent.concurrency=0 derives it from the cluster"
            ],
        ),
        (
            ["agent.provenance_workers=-1"],
            [
                "agent.provenance_workers=-1 is invalid; allowed: an integer >= 0 (0: the check runs on each "
                "episode's thread)"
            ],
        ),
        (["agent.provenance_workers=0", "engine.episodes_per_server=0"], []),
        (
            ["engine.episodes_per_server=-1"],
            ["engine.episodes_per_server=-1 is invalid; allowed: an integer >= 0 (0: not stated)"],
        ),
        (
            ["agent.rollout_timeout_s=-1"],
            ["agent.rollout_timeout_s=-1.0 is invalid; allowed: seconds >= 0 (0: no limit)"],
        ),
        (["agent.rollout_timeout_s=0", "agent.episode_timeout_s=0"], []),
        (
            ["agent.episode_timeout_s=720"],
            [
                f"agent.episode_timeout_s=720 {DEADLINE} stage2 t_max x sandbox.command_timeout_s = 6 x 120 = 720 s, plus time for generation"
            ],
        ),
        (["agent.episode_timeout_s=720.5"], []),
        (
            ["schedule=[eval]", "agent.episode_timeout_s=720"],
            [
                f"agent.episode_timeout_s=720 {DEADLINE} eval t_max x sandbox.command_timeout_s = 6 x 120 = 720 s, plus time for generation"
            ],
        ),
        (
            ["schedule=[rft]", "agent.episode_timeout_s=600"],
            [
                f"agent.episode_timeout_s=600 {DEADLINE} rft t_max x sandbox.command_timeout_s = 5 x 120 = 600 s, plus time for generation"
            ],
        ),
        (["schedule=[rft]", "agent.episode_timeout_s=601"], []),
        (
            ["checkpoint.keep_last=0"],
            [
                "checkpoint.keep_last=0 is invalid; allowed: an integer >= 1 (the last checkpoint is what a resume starts from)"
            ],
        ),
        (["eval.runs=0"], ["eval.k=[1, 3] is invalid; allowed: 1 <= k <= eval.runs (0)"]),
        (["eval.k=[0]"], ["eval.k=[0] is invalid; allowed: 1 <= k <= eval.runs (3)"]),
        (["eval.k=[4]"], ["eval.k=[4] is invalid; allowed: 1 <= k <= eval.runs (3)"]),
        (["eval.runs=1", "eval.k=[1]"], []),
        # The edges each range allows.
        *(
            (overrides, [])
            for overrides in (
                ["stage1.t_max=1", "stage1.l_thr=0"],
                ["stage1.samples_per_task=2"],
                ["stage1.min_optimizer_steps=3", "stage1.max_optimizer_steps=3"],
                ["stage1.context_length=1"],
                ["stage1.context_length=32768"],
                ["stage1.refresh_max_solve_rate=1"],
                ["stage1.optim.min_lr=0.0004"],
                ["stage1.optim.betas=[0,0.5]"],
                ["stage1.optim.grad_clip=0"],
                ["model.params_dtype=bfloat16"],
                ["engine.weight_sync_bucket_mb=0.5"],
                # world_size up to trainer_nodes x gpus_per_node (a product, not a quotient)
                [
                    "cluster.gpus_per_node=2",
                    "cluster.nodes=2",
                    "cluster.trainer_nodes=2",
                    "parallel.world_size=3",
                ],
            )
        ),
        (["stage1.eps_low=1"], ["stage1.eps_low=1.0 is invalid; allowed: 0 < eps_low < 1 (the paper: 0.2)"]),
        (
            ["stage1.min_optimizer_steps=2", "stage1.max_optimizer_steps=1"],
            [
                "stage1.min_optimizer_steps=2 / max_optimizer_steps=1 are invalid; allowed: 1 <= min_optimizer_steps "
                "<= max_optimizer_steps, or max 0 for no cap (the paper: 2, 8)"
            ],
        ),
        (
            ["algo.off_policy.tis_cap=0"],
            ["algo.off_policy.tis_cap=0.0 is invalid; allowed: null (off) or a finite number > 0"],
        ),
        (
            ["engine.weight_sync_port=65536"],
            ["engine.weight_sync_port=65536 is invalid; allowed: 0 (any free port) .. 65535"],
        ),
        (
            ["sandbox.backend=local", "sandbox.memory_mb=0"],
            [
                "sandbox.backend=local runs agent code unsandboxed; allowed: bwrap or apptainer, or set "
                "sandbox.allow_local=true for development",
                "sandbox.memory_mb=0 is invalid; allowed: a finite number > 0",
            ],
        ),
        (
            ["agent.episode_timeout_s=0.5"],
            [
                f"agent.episode_timeout_s=0.5 {DEADLINE} stage2 t_max x sandbox.command_timeout_s = 6 x 120 = 720 s, plus time for generation"
            ],
        ),
        (  # the stage with the most turns, not the last name
            ["schedule=[rft,stage1]", "rft.t_max=7", "agent.episode_timeout_s=840"],
            [
                f"agent.episode_timeout_s=840 {DEADLINE} rft t_max x sandbox.command_timeout_s = 7 x 120 = 840 s, plus time for generation"
            ],
        ),
    ],
)
def test_each_problem_is_one_exact_message(base, overrides, messages):
    assert problems(base, *overrides) == messages


def test_the_stage_checks_run_for_scheduled_stages_only(base):
    assert problems(base, "schedule=[eval]", "stage1.t_max=0", "rft.batch_size=0") == []


def test_a_key_the_stage_does_not_read_names_who_reads_it(base):
    assert problems(base, "stage1.warm_start_decoys=2", "rft.eps_high=0.5") == [
        "rft.eps_high=0.5 has no effect: only stage1 and stage2 read it; allowed: leave it unset (0.3)",
        "stage1.warm_start_decoys=2 has no effect: only rft read it; allowed: leave it unset (0)",
    ]


NUMBERS = [
    f.name
    for f in dataclasses.fields(SandboxConfig)
    if f.type in ("int", "float", int, float) and f.name not in ("sif_dir", "workspace_root")
]


@pytest.mark.parametrize("key", NUMBERS)
def test_every_sandbox_number_is_finite_and_positive(base, key):
    zero = "0.0" if SandboxConfig.__dataclass_fields__[key].type in ("float", float) else "0"
    found = problems(base, f"sandbox.{key}=0", "agent.concurrency=1")
    assert found[:1] == [f"sandbox.{key}={zero} is invalid; allowed: a finite number > 0"], found
    assert problems(base, f"sandbox.{key}=1", "agent.concurrency=1") == []


def test_sandbox_paths_are_absolute_and_the_image_folder_optional(base):
    assert problems(base, "sandbox.sif_dir=sifs") == [
        "sandbox.sif_dir='sifs' is invalid; allowed: an absolute path"
    ]
    assert problems(base, "sandbox.workspace_root=''") == [
        "sandbox.workspace_root='' is invalid; allowed: an absolute path"
    ]
    assert problems(base, "sandbox.sif_dir=''", "sandbox.workspace_root=/w") == []
    # The dataclass itself (the sandbox server checks its own settings with it), not only a config node.
    bad = SandboxConfig(memory_mb=-5, command_timeout_s=math.inf, workspace_root="rel")
    assert sandbox_problems(bad) == [
        "sandbox.memory_mb=-5 is invalid; allowed: a finite number > 0",
        "sandbox.command_timeout_s=inf is invalid; allowed: a finite number > 0",
        "sandbox.workspace_root='rel' is invalid; allowed: an absolute path",
    ]
    assert sandbox_problems(SandboxConfig()) == []
