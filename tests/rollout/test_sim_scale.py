"""The scale simulation (tools/sim_scale.py) small enough for CI: 64 episodes in flight through the real rollout
entry point, two stand-in vLLM server processes and two real sandbox servers, one of each killed mid-phase; every
episode ends, its failures retried on the live servers, none lost or counted twice, TensorBoard gets the rollout,
and the controller's cost per turn stays bounded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sandbox_servers import missing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


@pytest.mark.sandbox
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_64_episodes_in_flight_lose_one_engine_and_one_sandbox_server(tmp_path):
    import sim_scale

    from swe_megatron.monitor.tensorboard import read_scalars

    model = {"time_scale": 0.02, "turns_mean": 3.0, "obs_lines_median": 60.0, "fix_rate": 0.1}
    out = tmp_path / "figures.json"
    sim_scale.main(["--levels", "64", "--episodes-per-level", "64", "--engines", "2", "--sandbox-servers", "2", "--kill-at", "4",
                    "--t-max", "6", "--context", "16384", "--turn-model", json.dumps(model), "--json", str(out),
                    "--work", str(tmp_path / "work")])  # fmt: skip
    (r,) = json.loads(out.read_text())["levels"]
    assert r["episodes"] == 64 and r["infra_failures"] == 0 and r["drifted"] == 0, r
    assert sum(r["exit_reasons"].values()) == 64 and set(r["exit_reasons"]) <= {"submitted", "turn_limit"}, r
    trajs = [
        json.loads(x) for x in (tmp_path / "work" / "level-64" / "rollout" / "trajectories.jsonl").open()
    ]
    assert sorted(t["sample_index"] for t in trajs) == list(range(64))  # each once
    faults = r["faults"]
    assert (faults["engines_out"], faults["sandbox_servers_out"]) == (1, 1) and r["retries"] >= 1, r
    assert faults["retried_attempts_s"] > 0, r  # the time the fault cost, reported
    assert (
        r["turns"] == sum(t["num_steps"] for t in trajs) <= r["generate_calls"]
    )  # + the failed attempts' turns
    assert r["resolved"] == sum(t["resolved"] for t in trajs)
    scalars = read_scalars(tmp_path / "work" / "level-64" / "tb")
    assert any(k.startswith("episode/") for k in scalars), sorted(scalars)
    # the controller's own cost (CPU of this process; the stand-ins and the sandbox server are other processes)
    assert r["cpu_ms_per_turn"] < 100, r
    assert r["sockets_peak"] <= 3 * 64 + 16, (
        r
    )  # kept connections: about one per episode in flight per server kind


def test_the_trainer_beside_compares_the_steps_outside_a_phase_with_those_inside_it():
    """--trainer-core: a step counts as alone only when wholly before or after the phase, as during it only
    when wholly inside; one that straddles an edge counts for neither."""
    import sim_scale

    t = sim_scale.TrainerBeside(core=0)
    t.steps = [(0, 1, 1), (1, 2, 1), (2.5, 3.5, 1), (4, 6, 2), (6, 8, 2), (9.5, 10.5, 1), (11, 12, 1)]
    f = t.figures(3.0, 10.0)  # (2.5, 3.5) and (9.5, 10.5) straddle an edge
    assert (f["steps_alone"], f["steps_during"]) == (3, 2), f
    assert (f["step_s_alone"], f["step_s_during"], f["slowdown"]) == (1, 2, 1.0), f
    assert t.cpu_s() == 9
    assert "slowdown" not in sim_scale.TrainerBeside(core=0).figures(3.0, 10.0)
