"""Presets that use their cluster (config/capacity.py) and `swe-megatron plan PRESET`'s rollout phase."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from swe_megatron.cli import main
from swe_megatron.config.capacity import derive, idle_warnings
from swe_megatron.config.load import CapacityWarning, ConfigError, load_config
from swe_megatron.rollout.plan import RolloutAssumptions, rollout_phase


def test_paper_presets_keep_their_engines_busy():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        big, small = load_config("paper-72b"), load_config("paper-7b")
    # 16 servers x 64 episodes = 16 nodes x 64 sandbox slots; none left over to start sandboxes ahead
    assert (big.agent.concurrency, big.agent.prewarm_sandboxes) == (1024, 0)
    assert (small.agent.concurrency, small.agent.prewarm_sandboxes) == (512, 0)  # 16 x 32; 4 x 128 slots
    assert big.engine.weight_sync == small.engine.weight_sync == "broadcast"


def test_explicit_values_stay_and_prewarm_takes_the_spare_slots():
    cfg = load_config("embedded", ["sandbox.max_concurrent=20", "agent.prewarm_sandboxes=-1"])
    assert cfg.agent.concurrency == 4  # explicit
    assert cfg.agent.prewarm_sandboxes == 4  # (20 - 4 x 2) // 2 = 6 spare, at most concurrency
    cfg = load_config("embedded", ["agent.concurrency=0", "agent.prewarm_sandboxes=-1"])
    assert (cfg.agent.concurrency, cfg.agent.prewarm_sandboxes) == (4, 0)  # 4 slots, engine capacity unstated


def test_more_episodes_than_sandbox_slots_is_refused_with_one_message():
    with pytest.raises(ConfigError) as info:
        load_config("paper-72b", ["agent.concurrency=1500"])
    msg = str(info.value)
    assert "\n" not in msg and "agent.concurrency=1500" in msg and "64 x 16 = 1024" in msg


def test_a_concurrency_that_idles_most_engines_warns():
    with pytest.warns(CapacityWarning, match=r"agent.concurrency=4 .* 1024 .* 100% of them idle"):
        load_config("paper-72b", ["agent.concurrency=4"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        load_config("paper-72b", ["agent.concurrency=600"])  # most engines busy: quiet
        load_config("embedded")


def test_plan_prints_each_stage_rollout_phase(capsys):
    assert main(["plan", "paper-72b", "--top", "1"]) == 0
    out = capsys.readouterr().out
    for needle in ("stage1: 3000 episodes x 24 turns", "stage2: 1000 episodes x 48 turns", "generated",
                   "prefilled", "expected", "decodes 2500 and prefills 20000 tokens/s", "broadcast:", "TP  PP  CP"):  # fmt: skip
        assert needle in out, needle


def test_rollout_phase_scales_with_concurrency_and_prefix_cache():
    cfg = load_config("paper-72b")
    a = RolloutAssumptions()
    wide = rollout_phase(cfg, "stage1", a)
    with pytest.warns(CapacityWarning):
        narrow = rollout_phase(load_config("paper-72b", ["agent.concurrency=4"]), "stage1", a)
    # four at a time: 750 waves of 24 turns of (300 tokens at 2500 tok/s + 3 s) = 15.6 hours
    assert narrow.wall_s == pytest.approx(750 * 24 * (300 / 2500 + 3.0))
    assert wide.wall_s < narrow.wall_s / 50
    assert wide.generated == 3000 * 24 * 300
    uncached = rollout_phase(cfg, "stage1", RolloutAssumptions(prefix_cache=False))
    assert uncached.prefilled == uncached.prefilled_uncached > 10 * wide.prefilled


def _cluster(nodes=1, max_concurrent=8, servers=2, per_server=4, concurrency=0, prewarm=-1, grading=False):
    """Plain data with the fields config/capacity.py reads."""
    return SimpleNamespace(
        cluster=SimpleNamespace(nodes=nodes),
        sandbox=SimpleNamespace(max_concurrent=max_concurrent),
        engine=SimpleNamespace(num_servers=servers, episodes_per_server=per_server),
        agent=SimpleNamespace(concurrency=concurrency, prewarm_sandboxes=prewarm, prewarm_grading=grading),
    )


@pytest.mark.parametrize(
    "nodes, max_concurrent, servers, per_server, want",
    [
        (4, 128, 16, 32, 512),  # paper-7b: 512 slots, 512 engine places
        (4, 128, 16, 64, 512),  # engines could take 1024: the sandbox slots bound it
        (16, 64, 4, 32, 128),  # 1024 slots: the engines bound it
        (2, 10, 3, 0, 20),  # engine capacity not stated: every slot
        (0, 10, 3, 0, 10),  # no node count: one sandbox server
        (1, 0, 3, 0, 1),  # no slot at all: still one episode (validate.py reports the rest)
    ],
)
def test_derived_concurrency_is_the_smaller_of_engine_places_and_sandbox_slots(
    nodes, max_concurrent, servers, per_server, want
):
    cfg = _cluster(nodes, max_concurrent, servers, per_server)
    derive(cfg)
    assert cfg.agent.concurrency == want


def test_derived_prewarm_never_overbooks_the_sandbox_slots_and_takes_all_it_can():
    """Over a grid of clusters: running episodes plus prewarmed sandboxes (each holding a slot per sandbox the
    episode needs) fit in the slots, and one more prewarmed sandbox would not (or it is at concurrency)."""
    for slots in range(1, 41):
        for concurrency in range(1, slots + 1):
            for grading in (False, True):
                cfg = _cluster(max_concurrent=slots, concurrency=concurrency, grading=grading)
                derive(cfg)
                per, p = 2 if grading else 1, cfg.agent.prewarm_sandboxes
                where = (slots, concurrency, grading, p)
                assert type(p) is int and 0 <= p <= concurrency and cfg.agent.concurrency == concurrency, (
                    where
                )
                if concurrency * per <= slots:
                    assert (concurrency + p) * per <= slots, where  # no overbooking
                    assert p == concurrency or (concurrency + p + 1) * per > slots, where  # none left idle


def test_explicit_prewarm_and_concurrency_stay():
    cfg = _cluster(max_concurrent=100, concurrency=3, prewarm=7)
    derive(cfg)
    assert (cfg.agent.concurrency, cfg.agent.prewarm_sandboxes) == (3, 7)


@pytest.mark.parametrize("concurrency, warned", [(1, True), (7, True), (8, False), (16, False)])
def test_the_idle_warning_starts_below_half_the_engine_places(concurrency, warned):
    cfg = _cluster(servers=4, per_server=4, concurrency=concurrency)  # 16 engine places
    got = idle_warnings(cfg)
    assert bool(got) == warned
    if warned:
        idle = round(100 * (1 - concurrency / 16))
        assert got == [
            f"agent.concurrency={concurrency} keeps {concurrency} episodes in flight on engines that can run 16 "
            f"(engine.num_servers x episodes_per_server = 4 x 4): {idle}% of them idle; set agent.concurrency=0 "
            "to derive it from the cluster, or a larger number"
        ]
    assert idle_warnings(_cluster(servers=4, per_server=0, concurrency=1)) == []  # capacity not stated


def test_plan_prints_assumptions_in_words_and_suggests_recompute_only_when_not_full(capsys):
    """Issue 42 item 10: `plan paper-7b` printed a raw RolloutAssumptions(...) repr, and a plan that fits nothing
    under --recompute full (the default) suggested recompute=full."""
    from swe_megatron.cli import main

    main(["plan", "paper-7b"])
    out = capsys.readouterr().out
    assert "RolloutAssumptions(" not in out and "mean turns 0.6 x t_max (--turns-fraction)" in out
    assert main(["plan", "paper-72b", "--gpus", "3"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "no layout fits: more GPUs or a shorter context"
    assert main(["plan", "paper-72b", "--gpus", "3", "--recompute", "selective"]) == 1
    assert "--recompute full" in capsys.readouterr().out.splitlines()[-1]
