"""The optional W&B sink (monitor.wandb): offline, it writes a run under RUN_DIR/wandb that reads back with the same
scalars, histograms and text TensorBoard gets; wandb missing is one line naming the fix; commands that do not log
never import wandb; the config refuses a bad project or mode in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from swe_megatron.config.load import ConfigError, load_config
from swe_megatron.errors import UsageError
from swe_megatron.monitor import read_scalars
from swe_megatron.pipeline.run_dir import RunDir, open_monitor


def test_offline_run_lands_in_the_run_dir_and_reads_back(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from swe_megatron.monitor.wandb_sink import read_history, read_records

    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    run = tmp_path / "run"
    cfg = load_config(
        "embedded", [f"run_dir={run}", "monitor.wandb.enabled=true", "monitor.wandb.project=p1"]
    )
    mon = open_monitor(RunDir(run), cfg)
    for it in range(2):
        mon.scalars("reward", {"mean": 0.5 * it, "missing": None, "bad": float("nan")}, it)
        mon.histogram("episode/steps_hist", [1, 2, 3 + it], it)
        mon.histogram("episode/empty", [], it)
    mon.scalars("warm_start_epoch", {"loss": 0.25}, 7)  # x is the loop's own, not W&B's call counter
    mon.text("samples/0", "<turn> 1 & done", 1)
    mon.close()

    (folder,) = (run / "wandb").glob("offline-run-*")
    assert f"run: W&B offline run {folder.name.rsplit('-', 1)[1]} in {folder}" in capsys.readouterr().out
    rows = read_history(run / "wandb")
    scalars = [
        (r["step"], k, v) for r in rows for k, v in r.items() if k.startswith(("reward/", "warm_start"))
    ]
    assert scalars == [(0, "reward/mean", 0.0), (1, "reward/mean", 0.5), (7, "warm_start_epoch/loss", 0.25)]
    hists = [
        (r["step"], sum(r["episode/steps_hist/values"])) for r in rows if "episode/steps_hist/values" in r
    ]
    assert hists == [(0, 3), (1, 3)] and not any(k.startswith("episode/empty") for r in rows for k in r)
    (text,) = [r["samples/0/path"] for r in rows if "samples/0/path" in r]
    assert (folder / "files" / text).read_text().endswith("<pre>&lt;turn&gt; 1 &amp; done</pre>")
    # TensorBoard (the default) got the same calls, and the run's config went to W&B's config panel.
    assert read_scalars(run / "tensorboard")["reward/mean"] == [(0, 0.0), (1, 0.5)]
    (started,) = [r.run for r in read_records(run / "wandb") if r.WhichOneof("record_type") == "run"]
    assert (started.project, started.display_name, started.run_group) == ("p1", "embedded", "embedded")
    config = {i.key: json.loads(i.value_json) for i in started.config.update}
    assert config["monitor"]["wandb"] == {"enabled": True, "project": "p1", "mode": "offline", "dir": ""}


def test_wandb_missing_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import raises ImportError
    cfg = load_config(
        "embedded", [f"run_dir={tmp_path}", "monitor.wandb.enabled=true", "monitor.tensorboard=false"]
    )
    with pytest.raises(UsageError) as info:
        open_monitor(RunDir(tmp_path), cfg)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("monitor.wandb.enabled=true but wandb does not import (")
    assert "pip install wandb" in str(info.value)


def test_commands_that_do_not_log_do_not_import_wandb():
    code = (
        "import sys; from swe_megatron.cli import main; from swe_megatron.pipeline import run_dir; "
        "main(['show-config', 'embedded', 'monitor.wandb.enabled=true']); "
        "print('wandb' in sys.modules, file=sys.stderr)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr.strip() == "False", res.stderr[-2000:]
    assert "enabled: true" in res.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "monitor.wandb.project=team/x",
            "monitor.wandb.project='team/x' is invalid; allowed: a non-empty name",
        ),
        ("monitor.wandb.project=", "monitor.wandb.project='' is invalid; allowed: a non-empty name"),
        ("monitor.wandb.mode=cloud", "monitor.wandb.mode"),
    ],
)
def test_config_refuses_bad_values_in_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("embedded", [override])
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_relative_dir_is_read_from_the_repository_root():
    from swe_megatron.config.load import REPO_ROOT

    assert load_config("embedded", ["monitor.wandb.dir=logs/wb"]).monitor.wandb.dir == str(
        REPO_ROOT / "logs/wb"
    )
    assert load_config("embedded").monitor.wandb.dir == ""
