"""The config tree: presets carry the paper's values, overrides work, bad input fails with one message."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from swe_megatron.cli import main
from swe_megatron.config import CONFIGS_DIR, ConfigError, load_config
from swe_megatron.config import schema as S

RUN_PRESETS = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
FRAGMENTS = sorted(
    str(p.relative_to(CONFIGS_DIR))
    for d in ("algo", "model", "stage", "cluster")
    for p in (CONFIGS_DIR / d).glob("*.yaml")
)


@pytest.mark.parametrize("preset", RUN_PRESETS)
def test_every_run_preset_loads(preset):
    cfg = load_config(preset)
    assert OmegaConf.is_readonly(cfg)


@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_every_fragment_is_used_by_a_run_preset(fragment):
    """Fragments (model/stage/cluster) are composed, not run alone; each must be reachable from a run preset,
    or be named as a group override (`cluster=cpu-3x`) in the README."""
    used = "".join((CONFIGS_DIR / f"{p}.yaml").read_text() for p in RUN_PRESETS)
    group, _, name = fragment.removesuffix(".yaml").partition("/")
    assert fragment in used or f"{group}={name}" in (CONFIGS_DIR.parent / "README.md").read_text()


def test_paper_values_in_stage_presets():
    """Every number of paper-spec.md's recipe, as the 72B preset resolves it."""
    cfg = load_config("paper-72b")
    assert list(cfg.schedule) == ["rft", "stage1", "stage2", "eval"]
    rft, s1, s2 = cfg.rft, cfg.stage1, cfg.stage2
    assert rft.samples_per_task == 10 and rft.batch_size == 64
    assert rft.epochs == 1 and rft.context_length == 65536 and rft.one_shot_demo
    assert (rft.optim.lr, rft.optim.weight_decay, rft.optim.warmup_steps) == (5e-6, 0.1, 10)
    assert rft.optim.schedule == S.LrSchedule.cosine and rft.optim.min_lr == 0.0
    assert (s1.tasks_per_iteration, s2.tasks_per_iteration) == (300, 100)
    assert (s1.batch_size, s2.batch_size) == (128, 256)
    assert (s1.eps_low, s1.eps_high, s2.eps_low, s2.eps_high) == (0.2, 0.3, 0.2, 0.26)
    assert (s1.t_max, s2.t_max, s1.l_thr, s2.l_thr) == (40, 80, 10, 10)
    assert (s1.context_length, s2.context_length) == (65536, 131072)
    assert s1.samples_per_task == s2.samples_per_task == 10
    for st in (s1, s2):
        assert (st.min_optimizer_steps, st.max_optimizer_steps, st.epochs) == (2, 8, 1)
        o = st.optim
        assert (o.lr, list(o.betas), o.eps, o.weight_decay, o.grad_clip) == (
            1e-6,
            [0.9, 0.999],
            1e-8,
            0.1,
            1.0,
        )
    assert s2.refresh_pool and not s1.refresh_pool
    assert s2.refresh_max_solve_rate == pytest.approx(2 / 3) and s2.refresh_drop_never_solved
    samp = cfg.sampling
    assert (samp.temperature, samp.top_p, samp.top_k, samp.min_p) == (1.0, 1.0, -1, 0.0)
    assert (samp.repetition_penalty, samp.presence_penalty, samp.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (cfg.eval.runs, list(cfg.eval.k)) == (10, [1, 10])
    assert cfg.model.rope_scaling.type == "yarn" and cfg.model.rope_scaling.factor == 4.0
    assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node) == (16, 8)
    assert (cfg.tasks.max_files_changed, cfg.tasks.max_lines_changed) == (7, 499)


def test_model_presets_match_hf_shapes():
    m72 = load_config("paper-72b").model
    assert (m72.hidden_size, m72.num_layers, m72.num_attention_heads, m72.num_key_value_heads) == (
        8192,
        80,
        64,
        8,
    )
    assert (m72.intermediate_size, m72.vocab_size, m72.qkv_bias) == (29568, 152064, True)
    m7 = load_config("paper-7b").model
    assert (m7.hidden_size, m7.num_layers, m7.num_attention_heads, m7.num_key_value_heads) == (
        3584,
        28,
        28,
        4,
    )
    tiny = load_config("embedded").model
    assert tiny.architecture == "qwen2" and tiny.params_dtype == "float32"


def test_overrides_and_interpolation():
    cfg = load_config("embedded", ["stage1.t_max=30", "name=x", "stage1.optim.betas=[0.8, 0.95]"])
    assert cfg.stage1.t_max == 30 and list(cfg.stage1.optim.betas) == [0.8, 0.95]
    assert cfg.run_dir == str(CONFIGS_DIR.parent / "runs" / "x")  # relative paths: under the repository


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("stage1.eps_lw=0.1", ["stage1.eps_lw", "eps_low", "eps_high"]),
        ("nope=1", ["'nope'", "stage1", "sampling"]),
        ("stage1.eps_low=1.0", ["stage1.eps_low", "0 < eps_low < 1"]),
        ("stage1.eps_low=-0.1", ["stage1.eps_low"]),
        ("stage1.t_max=abc", ["stage1.t_max", "int", "'abc'"]),
        ("sampling.top_k=50", ["sampling.top_k", "-1", "stage1"]),
        ("sampling.min_p=0.05", ["sampling.min_p", "0.0"]),
        ("sampling.temperature=0.7", ["sampling.temperature", "1.0"]),
        ("sandbox.backend=docker", ["sandbox.backend", "bwrap", "apptainer", "local"]),
        ("sandbox.backend=local", ["sandbox.allow_local"]),
        ("stage1.l_thr=50", ["stage1.l_thr", "t_max"]),
        ("stage2.context_length=200000", ["stage2.context_length", "rope_scaling"]),
        ("schedule=[rft,stage3]", ["stage3", "stage1"]),
        ("parallel.world_size=0", ["parallel.world_size", ">= 1"]),
        ("parallel.tensor_parallel=4", ["parallel.world_size", "multiple"]),
        ("stage1.min_optimizer_steps=9", ["min_optimizer_steps", "max_optimizer_steps"]),
        ("stage1", ["key=value"]),
        # The trainer implements plain RoPE and YaRN only: any other type would train without it.
        ("model.rope_scaling.type=linear", ["model.rope_scaling.type", "'linear'", "null, yarn"]),
        ("model.rope_scaling.type=dynamic", ["model.rope_scaling.type", "'dynamic'", "null, yarn"]),
        ("model.rope_scaling.factor=4.0", ["model.rope_scaling.factor", "type=yarn"]),
        ("model.rope_scaling={type: yarn, factor: 0.5}", ["model.rope_scaling.factor", "> 1"]),
        ("algo.off_policy.tis_cap=0", ["algo.off_policy.tis_cap=0", "> 0", "null"]),
        ("algo.off_policy.tis_cap=-1.5", ["algo.off_policy.tis_cap=-1.5", "> 0"]),
        ("algo.off_policy.mask_threshold=0.0", ["algo.off_policy.mask_threshold=0.0", "> 0", "null"]),
        ("algo.max_staleness=-1", ["algo.max_staleness=-1", "0 (synchronous", "1..15"]),
        ("algo.max_staleness=16", ["algo.max_staleness=16", "1..15"]),
        ("checkpoint.keep_last=0", ["checkpoint.keep_last=0", ">= 1"]),
    ],
)
def test_bad_values_fail_with_one_message(override, needles):
    with pytest.raises(ConfigError) as info:
        load_config("embedded", [override])
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize(
    ("key", "edges", "outside"),
    [
        ("algo.max_staleness", (0, 15), (-1, 16)),
        ("engine.weight_sync_port", (0, 65535), (-1, 65536)),
        ("algo.off_policy.tis_cap", (1e-9, 1e300), (0.0, float("inf"))),
    ],
)
def test_range_edges_are_inclusive_where_allowed(key, edges, outside):
    """The last allowed value on each side loads; the next one is refused, naming the key."""
    for value in edges:
        cfg = load_config("embedded", [f"{key}={value}"])
        assert OmegaConf.select(cfg, key) == value
    for value in outside:
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}=.* is invalid"):
            load_config("embedded", [f"{key}={value}"])


def test_truncated_sampling_is_fine_without_rl_stages():
    cfg = load_config("embedded", ["schedule=[eval]", "sampling.top_k=20"])
    assert cfg.sampling.top_k == 20


def test_bad_yaml_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("_base_: [embedded.yaml]\nstage1: {eps_high: high}\n")
    with pytest.raises(ConfigError, match=r"stage1.eps_high.*'high'.*float"):
        load_config(str(bad))
    loop = tmp_path / "loop.yaml"
    loop.write_text("_base_: [loop.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(loop))
    with pytest.raises(ConfigError, match="not found.*embedded"):
        load_config(str(tmp_path / "missing"))


def _dataclasses(cls, seen):
    if cls in seen or not dataclasses.is_dataclass(cls):
        return
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        _dataclasses(tp, seen)


def test_every_config_field_has_a_docstring():
    """Field docstrings are the config's documentation; read them from the source."""
    import ast
    import inspect

    seen: set = set()
    _dataclasses(S.RunConfig, seen)
    tree = ast.parse(inspect.getsource(S))
    documented = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            documented[node.name] = {
                stmt.target.id
                for stmt, nxt in zip(body, body[1:])
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            }
    for cls in seen:
        missing = {f.name for f in dataclasses.fields(cls)} - documented.get(cls.__name__, set())
        assert not missing, f"{cls.__name__} fields without a docstring: {sorted(missing)}"


def test_cli_show_config(capsys):
    assert main(["show-config", "paper-72b", "stage2.eps_high=0.28"]) == 0
    out = capsys.readouterr().out
    assert "eps_high: 0.28" in out and "Qwen2.5-72B-Instruct" in out
    assert main(["show-config", "paper-72b", "stage2.eps_low=1.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stage2.eps_low" in err


def test_console_script_installed():
    exe = subprocess.run(
        [sys.executable, "-m", "swe_megatron.cli", "show-config", "embedded"], capture_output=True, text=True
    )
    assert exe.returncode == 0 and "name: embedded" in exe.stdout


def test_tensor_parallel_must_divide_the_kv_heads():
    with pytest.raises(ConfigError) as info:
        load_config(
            "embedded", ["parallel.world_size=2", "parallel.tensor_parallel=2"]
        )  # tiny model: 1 KV head
    assert "model.num_key_value_heads (1)" in str(info.value) and "a divisor of it" in str(info.value)
    cfg = load_config(
        "embedded", ["parallel.world_size=2", "parallel.tensor_parallel=2", "model.num_key_value_heads=2"]
    )
    assert cfg.parallel.tensor_parallel == 2


SANDBOX_NUMBERS = [
    f.name for f in dataclasses.fields(S.SandboxConfig) if f.type in ("int", "float", int, float)
]
BAD_NUMBERS = {"int": ["0", "-5"], "float": ["0", "-1", ".nan", ".inf"]}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (key, bad)
        for key in SANDBOX_NUMBERS
        for bad in BAD_NUMBERS[
            "float" if S.SandboxConfig.__dataclass_fields__[key].type in ("float", float) else "int"
        ]
    ]
    + [("workspace_root", "relative/sandboxes"), ("workspace_root", ""), ("sif_dir", "sifs")],
)
def test_every_sandbox_setting_has_a_validated_range(key, value):
    """Each numeric sandbox/grading limit is positive and finite (memory_mb=-5 used to remove the memory limit,
    max_processes=0 / tmpfs_mb=-1 made every grading an infra error, nan timeouts never fired); paths are
    absolute. One message naming the key and what is allowed."""
    with pytest.raises(ConfigError) as info:
        load_config("embedded", [f"sandbox.{key}={value}"])
    msg = str(info.value)
    assert "\n" not in msg and f"sandbox.{key}=" in msg, msg
    assert "allowed:" in msg and ("absolute" in msg if key in ("workspace_root", "sif_dir") else "> 0" in msg)


def test_sandbox_limits_accept_positive_values_and_an_absolute_workspace():
    cfg = load_config(
        "embedded", ["sandbox.memory_mb=1", "sandbox.command_timeout_s=0.5", "sandbox.workspace_root=/srv/sb"]
    )
    assert (cfg.sandbox.memory_mb, cfg.sandbox.command_timeout_s) == (1, 0.5)
    assert load_config("embedded", ["sandbox.sif_dir=/srv/sifs"]).sandbox.sif_dir == "/srv/sifs"


@pytest.mark.parametrize(
    "override",
    [
        "stage1.warm_start=scripted",
        "stage2.warm_start_epochs=3",
        "stage1.warm_start_lr=0.01",
        "stage2.warm_start_anneal_epochs=5",
        "stage2.warm_start_decoys=1",
        "stage1.max_kept_per_task=3",
        "stage2.epochs=3",  # DAPO takes one pass over its batch (pipeline/stages.py); epochs is RFT's
        "rft.eps_low=0.1",
        "rft.eps_high=0.5",
    ],
)
def test_a_stage_setting_the_stage_does_not_use_is_refused(override):
    """The warm start and the per-task cap are rejection fine-tuning's (the pipeline reads them for rft only),
    the clip range is DAPO's (rft never reads it): set on the other kind of stage, one message names the key."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.* has no effect"):
        load_config("embedded", [override])


def test_a_group_override_merges_a_fragment_in_place(tmp_path):
    """`cluster=cpu-3x` (like Hydra's config groups) merges configs/cluster/cpu-3x.yaml over the preset, in
    order with the other overrides; an unknown fragment is one error naming what exists."""
    cfg = load_config("embedded", ["cluster=cpu-3x", "engine.num_servers=1", f"run_dir={tmp_path}"])
    assert (cfg.cluster.nodes, cfg.cluster.trainer_nodes, cfg.cluster.engine_nodes) == (3, 2, 1)
    assert cfg.parallel.world_size == 2 and cfg.sandbox.backend == "bwrap"
    assert cfg.stage2.t_max == 6  # the preset's own settings stay
    later = load_config("embedded", ["cluster=cpu-3x", "parallel.world_size=1", f"run_dir={tmp_path}"])
    assert later.parallel.world_size == 1
    with pytest.raises(ConfigError, match=r"cluster=cpu-9x.*cpu-3x.*local-cpu"):
        load_config("embedded", ["cluster=cpu-9x"])
    fast = load_config("embedded", ["algo=async"])  # the async preset turns the off-policy correction on
    assert (
        fast.algo.max_staleness == 1 and fast.algo.off_policy.tis_cap == 2.0 and fast.agent.partial_rollouts
    )
    assert load_config("embedded").algo.max_staleness == 0  # the paper's synchronous loop by default


def test_an_episode_deadline_the_agents_own_commands_can_reach_is_refused():
    """Issue 24 attack 7: t_max x sandbox.command_timeout_s past agent.episode_timeout_s let an honest slow agent
    be excluded (harness_timeout); the config refuses it in one message, naming the stage and the sum."""
    with pytest.raises(ConfigError) as info:
        load_config("paper-7b", ["agent.episode_timeout_s=3600"])
    (line,) = [x for x in str(info.value).splitlines() if "episode_timeout_s" in x]
    assert "80 x 120 = 9600 s" in line, line
    load_config("paper-7b", ["agent.episode_timeout_s=9601"])
    load_config("paper-7b", ["agent.episode_timeout_s=0"])


def test_every_config_problem_is_listed_with_its_source():
    """Issue 27: '(and 1 more)' hid the second error, and an override's error was blamed on the preset."""
    with pytest.raises(ConfigError) as info:
        load_config("embedded", ["stage2.eps_low=1.5", "stage1.t_max=0"])
    msg = str(info.value)
    assert "more)" not in msg and "\n" not in msg
    assert (
        "stage2.eps_low=1.5 is invalid; allowed: 0 < eps_low < 1 (the paper: 0.2) (from override stage2.eps_low=1.5)"
        in msg
    )
    assert "stage1.t_max=0 is invalid; allowed: an integer >= 1 turns (from override stage1.t_max=0)" in msg
    preset = CONFIGS_DIR / "embedded.yaml"
    assert (
        f"stage1.l_thr=3 is invalid; allowed: 0 <= l_thr < t_max (0) (from {preset})" in msg
    )  # preset's value


def test_an_empty_schedule_is_refused():
    with pytest.raises(ConfigError, match=r"schedule=\[\] is invalid \(nothing to run\)"):
        load_config("embedded", ["schedule=[]"])


def test_config_paths_are_read_from_the_repository_not_the_cwd(tmp_path, monkeypatch):
    """Run from another folder, a relative tasks file was looked for (and built) there (issue 27 item 4)."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        "embedded", ["run_dir=runs/y", "cluster.rendezvous=~/rv.json", "cluster.log_dir=/abs/logs"]
    )
    repo, home = CONFIGS_DIR.parent, Path("~").expanduser()
    assert cfg.tasks.train_file == str(repo / "data/tasks/train.jsonl")
    assert cfg.run_dir == str(repo / "runs/y") and cfg.cluster.log_dir == "/abs/logs"
    assert cfg.cluster.rendezvous == str(home / "rv.json") and cfg.sandbox.sif_dir == ""
    assert cfg.engine.cache_dir == str(home / ".cache/swe-megatron/engine")


def test_show_config_without_arguments_says_what_it_needs(capsys):
    """Issue 42 item 10: argparse said "required: CONFIG, key=value" though the overrides are optional."""
    assert main(["show-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs CONFIG" in err and "embedded" in err and "key=value" not in err
