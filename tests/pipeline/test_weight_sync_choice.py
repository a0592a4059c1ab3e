"""The pipeline picks its weight-sync class from engine.weight_sync when the run starts, and refuses the
broadcast method (not wired into the pipeline yet) before anything is written or started."""

from __future__ import annotations

import pytest

from swe_megatron.config.load import load_config
from swe_megatron.errors import UsageError
from swe_megatron.pipeline.driver import run
from swe_megatron.train.weight_sync import METHODS, BroadcastWeightSync, FileWeightSync, pipeline_method


def test_each_method_has_its_class_and_the_pipeline_runs_files():
    assert {"file": FileWeightSync, "nccl": BroadcastWeightSync} == METHODS
    assert pipeline_method("file") is FileWeightSync
    with pytest.raises(UsageError, match="engine.weight_sync='ipc' is unknown"):
        pipeline_method("ipc")


def test_run_refuses_broadcast_before_anything_starts(tmp_path):
    # model.hf_path names no folder: a run that went past the weight-sync choice would fail on it instead.
    cfg = load_config(
        "embedded",
        [f"run_dir={tmp_path / 'run'}", "engine.weight_sync=nccl", f"model.hf_path={tmp_path / 'no-model'}"],
    )
    with pytest.raises(
        UsageError, match="engine.weight_sync=nccl: the training pipeline syncs weights through"
    ):
        run(cfg)
    assert not (tmp_path / "run").exists()
