"""The Trajectory record: JSON round trip, consistency checks, loss masks, exclusion."""

import json

import pytest

from swe_megatron.trajectory import ExitReason, Trajectory

from .conftest import build_trajectory


def test_json_round_trip_through_jsonl(tmp_path):
    trajs = [
        build_trajectory(
            "a",
            0,
            turns=3,
            malformed=(1,),
            resolved=True,
            patch="diff --git a/x b/x\n+é\n",
            timings={"generate": 1.5, "grade": 0.25},
        ),
        build_trajectory(
            "b", 7, turns=1, exit_reason=ExitReason.engine_error, infra_failure="engine: HTTP 500"
        ),
        build_trajectory("c", 2, turns=2, exit_reason="turn_limit", drifted=True),
    ]
    path = tmp_path / "trajs.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in trajs), encoding="utf-8")
    back = [Trajectory.from_json(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert back == trajs
    assert back[2].exit_reason is ExitReason.turn_limit
    assert json.loads(trajs[0].to_json())["exit_reason"] == "submitted"
    assert isinstance(json.loads(trajs[0].to_json())["turn_spans"][0], list)


def test_a_vllm_logprob_is_kept_exactly_in_four_bytes():
    """vLLM computes logprobs in float32 (Sampler.compute_logprobs) and the trainer reads them as float32, so
    a token's three fields take 4 + 1 + 4 bytes (docs/benchmarks.md, "Scale": memory at 131k contexts), and a
    float32 value the engine sent survives the trajectory and its JSON line bit for bit."""
    import numpy as np

    lp = [float(np.float32(x)) for x in (-0.1, -3.7e-5, -17.25, -1e-12)]
    t = build_trajectory(turns=2)
    a = [i for i, m in enumerate(t.action_mask) if m]
    for i, x in zip(a, lp):
        t.logprobs[i] = x
    back = Trajectory.from_json(t.to_json())
    assert [back.logprobs[i] for i in a] == lp
    assert sum(f.itemsize for f in (t.token_ids, t.action_mask, t.logprobs)) == 9


def test_from_dict_rejects_unknown_and_missing_fields():
    d = build_trajectory().to_dict()
    with pytest.raises(ValueError, match="unknown Trajectory field"):
        Trajectory.from_dict({**d, "rewrd": 1.0})
    del d["task_id"]
    with pytest.raises(ValueError, match="task_id"):
        Trajectory.from_dict(d)
    with pytest.raises(ValueError):
        Trajectory.from_dict({**build_trajectory().to_dict(), "exit_reason": "gave_up"})


def test_loss_mask_masks_malformed_turns_only_when_asked():
    t = build_trajectory(turns=3, malformed=(1,))
    t.check()
    # prompt 3 tokens, then per turn [a, a, obs, obs]
    assert list(t.action_mask) == [0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    assert t.loss_mask(mask_malformed=False) == list(t.action_mask)
    assert t.loss_mask(mask_malformed=True) == [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    drifted = build_trajectory(turns=2, drifted=True)
    assert drifted.loss_mask(mask_malformed=False) == [0] * len(drifted.token_ids)


def test_excluded_means_infrastructure_or_drift_but_not_limits():
    assert not build_trajectory(exit_reason=ExitReason.turn_limit).excluded
    assert not build_trajectory(exit_reason=ExitReason.context_limit).excluded
    assert not build_trajectory(exit_reason=ExitReason.format_limit).excluded
    assert build_trajectory(exit_reason=ExitReason.sandbox_error).excluded
    assert build_trajectory(infra_failure="grading: timeout").excluded
    assert build_trajectory(drifted=True).excluded
    assert {r.value for r in ExitReason if r.is_infra} == {
        "sandbox_error",
        "engine_error",
        "harness_timeout",
        "harness_error",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"logprobs": [0.0] * 5}, "same length"),
        ({"num_steps": 3}, "num_steps"),
        ({"prompt_len": 99}, "prompt_len"),
        ({"turn_spans": [[3, 5], [4, 9]]}, "overlaps"),
        ({"action_mask": [1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]}, "outside every assistant turn"),
        (
            {"logprobs": [0.0, 0.0, 0.0, -0.5, -0.25, -1.0, 0.0, -0.5, -0.25, 0.0, 0.0]},
            "logprobs must be 0.0",
        ),
        ({"malformed_turns": [2]}, "malformed_turns"),
    ],
)
def test_check_names_the_inconsistency(change, message):
    build_trajectory(turns=2).check()
    with pytest.raises(ValueError, match=message):
        build_trajectory(turns=2, **change).check()
