"""The pipeline picks its weight-sync class from engine.weight_sync when the run starts and the config checks the
broadcast settings. A real run that syncs by broadcast, stops, is killed and resumes, with the engine serving
the trainer's weights after every update: tests/pipeline/test_async_e2e.py (and across three Slurm nodes:
tests/launch/test_multinode.py)."""

from __future__ import annotations

import re

import pytest

from swe_megatron.config.load import ConfigError, load_config
from swe_megatron.errors import UsageError
from swe_megatron.train.weight_sync import METHODS, BroadcastWeightSync, FileWeightSync, pipeline_method


def test_each_method_has_its_class_and_the_pipeline_runs_both():
    assert {"file": FileWeightSync, "broadcast": BroadcastWeightSync} == METHODS
    assert pipeline_method("file") is FileWeightSync
    assert pipeline_method("broadcast") is BroadcastWeightSync
    with pytest.raises(UsageError, match="engine.weight_sync='nccl' is unknown: use one of file, broadcast"):
        pipeline_method("nccl")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("engine.weight_sync=nccl", "engine.weight_sync='nccl' is invalid; allowed: file, broadcast"),
        ("engine.weight_sync_bucket_mb=0", "engine.weight_sync_bucket_mb=0.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_bucket_mb=-1", "engine.weight_sync_bucket_mb=-1.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_timeout_s=0", "engine.weight_sync_timeout_s=0.0 is invalid; allowed: > 0"),
        ("engine.weight_sync_port=70000", "engine.weight_sync_port=70000 is invalid; allowed: 0 (any free"),
    ],
)
def test_bad_broadcast_settings_are_refused(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config("embedded", [override])


def test_the_engines_reach_trainer_rank_0_by_its_node_name_in_a_slurm_job(monkeypatch):
    from swe_megatron.train.weight_sync import master_address

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert master_address() == "127.0.0.1"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    assert master_address() == "node2"
