"""tools/learning_check.py: the figures and the verdict it prints from run folders (issue 38's targets)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import learning_check as lc  # noqa: E402


def _unit(rate: float, give_ups: int, n: int = 36) -> dict:
    """An RL unit's metrics.json as the pipeline writes it (one infra failure among n + 1 trajectories)."""
    return {"reward": {"resolved_rate": rate}, "episode": {"trajectories": n + 1.0, "give_up_rate": give_ups / n},
            "infra": {"failures": 1.0}}  # fmt: skip


def _run_dir(root: Path, stage1: list, stage2: list, pass1: float | None = 0.0) -> Path:
    for stage, units in (("stage1", stage1), ("stage2", stage2)):
        for i, (rate, gives) in enumerate(units):
            d = root / "units" / f"{stage}-{i}"
            d.mkdir(parents=True)
            (d / "metrics.json").write_text(json.dumps(_unit(rate, gives)))
    ws = root / "units" / "rft-warm_start"
    ws.mkdir(parents=True)
    (ws / "metrics.json").write_text(json.dumps({"warm_start": {"epochs": 54.0, "final_epoch_loss": 0.0349}}))
    if pass1 is not None:
        (root / "eval").mkdir()
        (root / "eval" / "report.json").write_text(json.dumps({"pass@1": pass1}))
    return root


def test_a_run_is_read_in_schedule_order_with_its_give_up_counts(tmp_path):
    units = [(0.1 * i, 12 - i) for i in range(11)]  # stage1-0 .. stage1-10: numeric order, not text order
    run = lc.read_run(_run_dir(tmp_path, units, [(0.9, 1)]))
    assert [u["unit"] for u in run["units"]] == [f"stage1-{i}" for i in range(11)] + ["stage2-0"]
    assert [u["give_ups"] for u in run["units"]][:3] == [12, 11, 10] and run["units"][0]["episodes"] == 36
    assert run["warm_start"]["epochs"] == 54.0 and run["heldout_pass@1"] == 0.0


def test_the_rises_and_the_targets(tmp_path):
    good = lc.read_run(_run_dir(tmp_path / "a", [(0.3, 20), (0.4, 18), (0.5, 14), (0.6, 10)], [(0.6, 9), (0.7, 6)]))
    flat = lc.read_run(_run_dir(tmp_path / "b", [(0.3, 20), (0.4, 18), (0.4, 19), (0.3, 20)], [(0.5, 14), (0.6, 15)]))
    x = lc.judge(good)
    assert round(x["rise_stage1"], 6) == 20.0 and round(x["rise_all"], 6) == 30.0 and x["give_ups_fell"]
    runs = [{"seed": 0, "exit_status": 0, **good}, {"seed": 1, "exit_status": 0, **flat}]
    summary, missed = lc.verdict(runs)
    assert [round(r, 6) for r in summary["rise_all"]] == [30.0, 20.0] and round(summary["rise_all_min"], 6) == 20.0
    # per step, mean of the two runs: (+10 +10), (+10 +0), (+10 -10), (+0 +20), (+10 +10)
    assert [round(g, 6) for g in summary["gain_per_iteration"]] == [10.0, 5.0, 0.0, 10.0, 10.0]
    assert [round(g, 6) for g in lc.gains([[0.1, 0.2, 0.4], [0.1, 0.3]])] == [15.0] and lc.gains([]) == []  # steps every run has
    # flat: stage 1 ends where it began (0 points: not a rise); all RL +20 and give-ups 19 -> 14.5 hold; mean +25
    assert missed == ["seed 1: stage 1 did not rise (+0.0)"]
    assert not any(m.startswith("seed 0") for m in missed)
    assert lc.verdict(runs[:1])[1] == []  # one good seed: every target holds
    failed = [{"seed": 2, "exit_status": 1, **lc.read_run(tmp_path / "missing")}]
    assert lc.verdict(failed)[1][0] == "seed 2: the run did not finish (exit status 1)"


def test_each_mode_is_a_valid_config_of_its_kind():
    """Every mode's overrides load on the embedded default: sync stays the paper's loop, k1 is staleness 1
    without the off-policy correction, async is the user's preset (staleness 1 with the correction)."""
    from swe_megatron.config.load import load_config

    algo = {m: load_config("embedded", lc.MODES[m]).algo for m in lc.MODES}
    assert algo["sync"].max_staleness == 0
    assert algo["k1"].max_staleness == 1 and algo["k1"].off_policy.tis_cap is None
    assert algo["async"].max_staleness == 1 and algo["async"].off_policy.tis_cap == 2.0


def test_a_run_reports_the_load_it_ran_at(monkeypatch, tmp_path):
    """run_sampling_load: the command's exit status and the mean load sampled while it ran (None when it ended
    before the first sample); load_note warns only when a run's load passed twice the cores (one run alone keeps
    about the cores busy)."""
    monkeypatch.setattr(lc, "LOAD_SAMPLE_S", 0.05)
    loads = iter([1.0, 3.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0] + [5.0] * 1000)
    monkeypatch.setattr(lc.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    with open(tmp_path / "log", "wb") as out:
        rc, load = lc.run_sampling_load([sys.executable, "-c", "import time; time.sleep(0.12); raise SystemExit(3)"],
                                        out, {})  # fmt: skip
    assert rc == 3 and load is not None and 1.0 <= load <= 5.0
    with open(tmp_path / "log", "wb") as out:
        assert lc.run_sampling_load([sys.executable, "-c", "pass"], out, {})[1] in (None, 5.0)
    runs = [{"load_mean": 1.5}, {"load_mean": None}, {"load_mean": 2.6}, {"load_mean": 4.0}]
    assert lc.load_note(runs, cores=2) is None
    runs.append({"load_mean": 6.5})
    note = lc.load_note(runs, cores=2)
    assert note.startswith("note: 1 of 5 runs ran at a mean load above twice the machine's 2 cores (up to 6.5)")
