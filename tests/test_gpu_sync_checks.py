"""tools/gpu_sync_checks.py (run by tools/gpu_check.sh on a GPU machine): its pure parts, the failure-path check
itself over gloo (the same SyncGroup code the NCCL run exercises), the child-process runner, and the whole script
on a machine without CUDA. The CUDA runs are gpu-marked (skipped here: no GPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import gpu_sync_checks as gsc  # noqa: E402

from swe_megatron.launch.steps import ALLOCATOR_CONF  # noqa: E402


def test_micro_batches_vary_within_bounds_in_multiples_of_128_and_repeat_for_a_seed():
    tokens = gsc.micro_batch_tokens(40, 2000, 32768)
    assert len(tokens) == 40 and all(2048 <= n <= 32768 and n % 128 == 0 for n in tokens)
    assert len(set(tokens)) > 20  # varying shapes are the point
    assert (
        tokens == gsc.micro_batch_tokens(40, 2000, 32768) != gsc.micro_batch_tokens(40, 2000, 32768, seed=1)
    )


def test_the_default_child_has_no_allocator_settings_the_others_the_trainer_s_and_the_sync_s():
    parent = {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "x"}
    default = gsc.child_env("allocator_default", parent)
    assert "PYTORCH_ALLOC_CONF" not in default and "PYTORCH_CUDA_ALLOC_CONF" not in default
    assert default["PYTHONPATH"] == str(gsc.ROOT) and default["PATH"] == "/bin"
    for check in ("allocator_trainer", "empty_cache", "nccl_abort"):
        env = gsc.child_env(check, parent)
        assert env["PYTORCH_ALLOC_CONF"] == ALLOCATOR_CONF == "expandable_segments:True"
        assert "PYTORCH_CUDA_ALLOC_CONF" not in env  # torch would read it first
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_train_like_keeps_only_the_weights():
    weights = gsc.train_like(torch.device("cpu"), [128, 256], hidden=8, layers=3, weight_gib=2**-20)
    assert weights.numel() == 1024 and weights.dtype == torch.uint8


def test_the_abort_check_over_gloo_gives_up_aborts_and_goes_on():
    """The same function the NCCL run calls, on CPU: gloo stands in for NCCL (its forming cannot be aborted, so
    the helper ends at the deadline; on NCCL the abort ends the forming communicator)."""
    out = gsc.check_abort(torch.device("cpu"), deadline_s=2.0, helper_wait_s=10.0)
    assert out["absent_join"] == "weight sync: joining the group took longer than 2 s"
    assert 2.0 <= out["absent_join_s"] < 4.0
    assert out["absent_group_made"] is False  # gloo: still in its constructor when given up
    assert out["absent_abort_returned"] is None  # so there was no group to abort
    # the helper's rendezvous times out with the join (before issue 41's fix: 2 s after it)
    assert out["absent_helper_alive"] is False and out["absent_helper_ended_s"] < 1.0
    assert out["formed_abort_ms"] >= 0 and out["after_compute_ok"] and out["fresh_sync_ok"]
    assert gsc.problems({"nccl_abort": out}) == []


def test_problems_name_each_contradiction():
    ok_abort = {"absent_join": "weight sync: joining the group took longer than 5 s", "absent_helper_alive": False,
                "after_compute_ok": True, "fresh_sync_ok": True}  # fmt: skip
    assert gsc.problems({"nccl_abort": ok_abort}) == []
    bad = {
        "allocator_default": {"error": "hung: no result after 120 s"},
        "nccl_abort": {
            **ok_abort,
            "absent_join": "formed without its second member (wrong)",
            "absent_helper_alive": True,
            "fresh_sync_ok": False,
        },  # fmt: skip
        "empty_cache": {"before": {"reserved_gib": 1.0}, "after": {"reserved_gib": 2.0}},
        "allocator_trainer": {"settings": "max_split_size_mb:64"},
    }
    found = gsc.problems(bad)
    assert len(found) == 6
    assert found[0] == "allocator_default: hung: no result after 120 s"
    assert any("still running 30 s after the abort" in f for f in found)
    assert any(f.startswith("allocator_trainer: expandable_segments:True is not in") for f in found)
    spelled = {"allocator_trainer": {"settings": "expandable_segments: True,max_split_size_mb:64"}}
    assert gsc.problems(spelled) == []
    assert gsc.problems({"allocator_trainer": {"settings": "(torch 2.8.0 cannot say)"}}) == []


def test_run_check_reads_the_result_line_and_reports_a_hang_or_a_crash():
    py = sys.executable
    ok = gsc.run_check([py, "-c", "print('noise'); print('RESULT {\"a\": 1.5}')"], dict(os.environ), 30)
    assert ok == {"a": 1.5}
    hung = gsc.run_check([py, "-c", "import time; time.sleep(30)"], dict(os.environ), 0.5)
    assert hung == {"error": "hung: no result after 0.5 s"}
    # a hang names the last step the child began (what hung on the H200: nothing said which)
    stuck = f"print('{gsc.STEP}1. join', flush=True); print('{gsc.STEP}2. abort', flush=True); import time; time.sleep(30)"
    hung = gsc.run_check([py, "-c", stuck], dict(os.environ), 2)
    assert hung == {"error": "hung: no result after 2 s (in: 2. abort)"}
    crashed = gsc.run_check([py, "-c", "raise SystemExit('no NCCL here')"], dict(os.environ), 30)
    assert crashed == {"error": "exit 1: no NCCL here"}


def test_figures_are_one_line_each_and_the_table_one_row_per_check():
    result = {"torch": "2.14.0", "released_gib": 1.25, "before": {"reserved_gib": 3.0}}
    assert gsc.figure_lines("empty_cache", result) == [
        "gpu_sync: empty_cache.torch = 2.14.0",
        "gpu_sync: empty_cache.released_gib = 1.250",
        "gpu_sync: empty_cache.before = {reserved_gib 3.000}",
    ]
    assert gsc.table({"empty_cache": result, "nccl_abort": {"skipped": gsc.NEEDS_GPU}}) == [
        "| check | result |",
        "|---|---|",
        "| empty_cache | released_gib 1.250; before {reserved_gib 3.000} |",
        f"| nccl_abort | {gsc.NEEDS_GPU} |",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")
def test_without_cuda_each_check_says_it_needs_a_gpu(capsys):
    assert gsc.main(["--only", "nccl_abort", "--timeout", "120"]) == 0
    assert f"gpu_sync: nccl_abort.skipped = {gsc.NEEDS_GPU}" in capsys.readouterr().out


@pytest.mark.gpu
def test_on_a_gpu_every_check_runs_without_a_problem(capsys):
    """The script as tools/gpu_check.sh runs it: each check in its own child; figures printed (-s)."""
    assert gsc.main([]) == 0, capsys.readouterr().out
