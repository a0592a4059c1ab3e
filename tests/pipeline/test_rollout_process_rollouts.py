"""pipeline/rollout_process.py with the run's real Rollouts: RolloutsSpec.of (what the trainer's process sends),
RolloutsSpec.build (the child's Rollouts over the same servers), Worker (a unit rolled out, the servers closed)
and RolloutProcess.for_run (all of it in the real child).

Fakes at the outer boundary only, labelled: the vLLM servers are HTTP stand-ins (tests/rollout/vllm_stub.py)
whose every turn submits at once; the sandbox server is the real one (sandbox/server.py, in this process) on
the local backend. Routing, engines, gate, Rollouts, episodes and grading are the real ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))  # the labelled vLLM HTTP stub
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))  # the in-process sandbox server
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # the tiny git task
from test_server_starts import _serve_in_thread  # noqa: E402
from tiny_repo import make_task  # noqa: E402
from vllm_stub import VllmStub  # noqa: E402

from swe_megatron.agent.tokens import ChatFormat  # noqa: E402
from swe_megatron.config.schema import RunConfig, SandboxConfig  # noqa: E402
from swe_megatron.engine.gate import VersionGate  # noqa: E402
from swe_megatron.engine.vllm import VllmEngine  # noqa: E402
from swe_megatron.model.tokenizer import load_tokenizer  # noqa: E402
from swe_megatron.pipeline.rollout_process import (  # noqa: E402
    RolloutProcess,
    RolloutProcessError,
    RolloutsSpec,
    Worker,
)
from swe_megatron.rollout.routing import ServersDown, policy_engine, run_sandboxes  # noqa: E402
from swe_megatron.rollout.setup import Rollouts  # noqa: E402
from swe_megatron.sandbox.server import SandboxServer  # noqa: E402

pytestmark = pytest.mark.timeout(
    60, method="thread"
)  # a deadlock fails in a minute (see test_rollout_process.py)

TOKEN = "rollout-process-test-token-0123"
SEEN = " (seen by the other rollout process)"
SUBMIT = [785, 5046, 374, 304, 1992, 624, 13874, 3989, 5955, 198, 73594, 151645]
"""'The fix is in place.\n```\nsubmit\n```<|im_end|>' in Qwen2.5's ids (not encoded here: each load of the
tokenizer takes seconds, and build() loads its own)."""
EOS = SUBMIT[-1]
"""Qwen2.5's end of turn."""


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(load_tokenizer("qwen2.5"))


@pytest.fixture(scope="module")
def engines():
    """Two stand-in vLLM servers whose every turn submits (labelled fake: the engine boundary)."""
    stubs = [VllmStub(SUBMIT), VllmStub(SUBMIT)]
    yield stubs
    for s in stubs:
        s.close()


@pytest.fixture(scope="module")
def sandbox_url():
    """A real sandbox server (local backend: plain subprocesses, no bwrap) in this process."""
    url, stop = _serve_in_thread(SandboxServer(SandboxConfig(backend="local", allow_local=True), TOKEN))
    yield url
    stop()


@pytest.fixture
def cfg(tmp_path) -> RunConfig:
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(backend="local", allow_local=True))
    cfg.monitor.progress = False
    cfg.agent.concurrency, cfg.agent.infra_retries = 2, 0
    cfg.agent.prewarm_sandboxes, cfg.agent.prewarm_grading = 0, False
    cfg.stage1.samples_per_task, cfg.stage2.samples_per_task = 2, 3
    cfg.engine.request_timeout_s = 30.0  # not the default: build() must pass the run's on
    cfg.sandbox.grade_timeout_s = 70.0
    return cfg


def _spec(cfg, engines, sandbox_url, **kw) -> RolloutsSpec:
    return RolloutsSpec(cfg, [e.url for e in engines], [sandbox_url], TOKEN, **{"version": 5, **kw})


def _run_rollouts(cfg, chat, engines, sandbox_url, version: int = 0) -> tuple[Rollouts, VersionGate]:
    """The run's Rollouts as pipeline/driver.py builds them: a gate over the routed engines, sandbox servers."""
    gate = VersionGate(policy_engine(cfg, [e.url for e in engines], chat.eos_id), version)
    return Rollouts(cfg, gate, run_sandboxes(cfg, [sandbox_url], TOKEN), chat), gate


def test_the_spec_of_a_runs_rollouts_names_its_config_servers_token_version_and_dead_servers(
    cfg, chat, engines, sandbox_url
):
    rollouts, gate = _run_rollouts(cfg, chat, engines, sandbox_url, version=3)
    try:
        gate.engine.rotation.drop(1, "missed the update")
        spec = RolloutsSpec.of(rollouts, gate)
    finally:
        rollouts.sandboxes.close()
    assert spec == RolloutsSpec(
        cfg, [engines[0].url, engines[1].url], [sandbox_url], TOKEN, 3,
        {"vLLM server": {engines[1].url: "missed the update"}, "sandbox server": {}},
    )  # fmt: skip
    assert spec.cfg is cfg


def test_the_spec_of_rollouts_not_on_servers_by_url_is_refused_naming_what_they_are_on(
    cfg, chat, engines, sandbox_url
):
    one = VersionGate(VllmEngine(engines[0].url, "policy", cfg.sampling, [chat.eos_id]))  # no rotation
    pool = run_sandboxes(cfg, [sandbox_url], TOKEN)
    try:
        with pytest.raises(RolloutProcessError, match=r"^async rollouts .* need the run's vLLM servers and sandbox "
                           "servers by URL; got engine VllmEngine and sandboxes SandboxPool$"):  # fmt: skip
            RolloutsSpec.of(Rollouts(cfg, one, pool, chat), one)
    finally:
        pool.close()
    routed = VersionGate(policy_engine(cfg, [engines[0].url], chat.eos_id))
    with pytest.raises(RolloutProcessError, match="got engine RoutedEngine and sandboxes NoneType$"):
        RolloutsSpec.of(Rollouts(cfg, routed, None, chat), routed)  # the local backend: no servers


def test_build_makes_the_runs_rollouts_over_the_same_servers_behind_a_gate_of_its_own(
    cfg, engines, sandbox_url
):
    cfg.agent.partial_rollouts = False  # episodes hold the gate: not the default
    dead = {"vLLM server": {engines[0].url: "missed the update"}}
    worker = _spec(cfg, engines, sandbox_url, dead=dead).build()
    try:
        r, gate = worker.rollouts, worker.gate
        routed, pool = gate.engine, r.sandboxes
        assert isinstance(r, Rollouts) and r.cfg is cfg and r.engine is gate
        assert gate.version == 5 and gate.per_episode is True
        assert [e.url for e in routed.engines] == [e.url for e in engines]
        assert all(e.stop_token_ids == [EOS] and e.timeout_s == 30.0 for e in routed.engines)
        assert routed.rotation.dead == {0: "missed the update" + SEEN}
        assert pool.rotation.names == [sandbox_url] and pool.rotation.live == [0]
        assert [(c.token, c.command_timeout_s) for c in pool.clients] == [(TOKEN, 70.0)]
        assert worker.rotations == [routed.rotation, pool.rotation]
        assert r.chat.eos_id == EOS
    finally:
        worker.close()


@pytest.mark.parametrize("kind", ["vLLM server", "sandbox server"])
def test_build_with_every_server_of_a_kind_out_of_rotation_is_servers_down(cfg, engines, sandbox_url, kind):
    names = [e.url for e in engines] if kind == "vLLM server" else [sandbox_url]
    with pytest.raises(ServersDown, match=f"^no {kind} is left in rotation"):
        _spec(cfg, engines, sandbox_url, dead={kind: dict.fromkeys(names, "gone")}).build()


def test_a_worker_rolls_out_a_stages_samples_into_the_unit_folder_and_closes_its_servers(
    cfg, engines, sandbox_url, tmp_path
):
    task = make_task(tmp_path, "tiny")
    worker = _spec(cfg, engines, sandbox_url).build()
    try:
        for stage, n in (("stage1", 2), ("stage2", 3)):
            before = sum(e.completions for e in engines)
            trajs, split = worker.roll(stage, [task], tmp_path / stage)
            assert len(trajs) == n and all(t.task_id == "tiny" for t in trajs), [
                t.infra_failure for t in trajs
            ]
            assert all(t.exit_reason.value == "submitted" and t.policy_versions == [5] for t in trajs)
            assert sum(e.completions for e in engines) - before == n  # one turn each, on the run's engines
            assert len((tmp_path / stage / "trajectories.jsonl").read_text().splitlines()) == n
            assert set(split) == {"rollout_s", "grade_s", "generate_s"} and split["rollout_s"] > 0
    finally:
        worker.close()
    assert all(c._closed.is_set() for c in worker.rollouts.sandboxes.clients)  # the session ended


def test_closing_a_worker_ends_its_provenance_processes(cfg, chat, engines, sandbox_url):
    cfg.agent.provenance_workers = 1
    rollouts, gate = _run_rollouts(cfg, chat, engines, sandbox_url)
    Worker(rollouts, gate, []).close()
    with pytest.raises(RuntimeError, match="after shutdown"):
        rollouts.provenance([], [], [])


def test_for_run_rolls_the_runs_units_out_in_the_child_in_step_with_the_parents_rotations(
    cfg, chat, engines, sandbox_url, tmp_path, capfd
):
    task = make_task(tmp_path, "tiny")
    rollouts, gate = _run_rollouts(cfg, chat, engines, sandbox_url, version=2)
    gate.engine.rotation.drop(0, "missed the update")  # the child must leave it out too
    proc = RolloutProcess.for_run(rollouts, gate)
    try:
        line = f"rollouts: async mode: the RL rollouts run in process {proc.proc.pid}"
        assert (
            line in capfd.readouterr().err.splitlines()
        )  # the run's log names it (test_async_e2e.py reads it)
        assert proc.rotations == [gate.engine.rotation, rollouts.sandboxes.rotation]
        before = engines[0].completions
        trajs, split = proc.roll("stage1", [task], tmp_path / "unit")
        assert len(trajs) == 2 and all(
            t.exit_reason.value == "submitted" and t.policy_versions == [2] for t in trajs
        )
        assert engines[0].completions == before, "a turn went to the server the parent had dropped"
        proc.pause()
        rollouts.sandboxes.rotation.drop(0, "gone")
        proc.resume(3)
        with pytest.raises(
            ServersDown, match="no sandbox server is left"
        ):  # the child's rotation lost it too
            proc.roll("stage1", [task], tmp_path / "unit2")
    finally:
        proc.close()
        rollouts.sandboxes.close()
    assert proc.proc.returncode == 0
