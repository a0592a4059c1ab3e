"""The monitor writes real TensorBoard event files that read back; NaN/None are skipped, not zeroed."""

from __future__ import annotations

from swe_megatron.monitor import Monitor, NullMonitor, read_scalars


def test_scalars_histograms_text_read_back(tmp_path):
    mon = Monitor(tmp_path / "tb", progress=False)
    for it in range(3):
        mon.scalars("rollout", {"reward": 0.5 * it, "missing": None, "bad": float("nan"), "label": "x"}, it)
        mon.histogram("rollout/steps", [1, 2, 3 + it], it)
        mon.histogram("rollout/empty", [], it)
        mon.text("samples/trajectory", f"**turn** {it}", it)
    assert list(mon.progress(range(4), total=4)) == [0, 1, 2, 3]
    mon.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["rollout/reward"] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert (
        "rollout/missing" not in scalars and "rollout/bad" not in scalars and "rollout/label" not in scalars
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "tb").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"histograms": 0, "tensors": 0})
    acc.Reload()
    assert "rollout/empty" not in acc.Tags()["histograms"]
    hist = [(e.step, e.histogram_value) for e in acc.Histograms("rollout/steps")]
    assert [(step, h.num, h.sum, h.min, h.max) for step, h in hist] == [
        (it, 3, 6 + it, 1, 3 + it) for it in range(3)
    ]
    texts = [
        (e.step, e.tensor_proto.string_val[0].decode())
        for e in acc.Tensors("samples/trajectory/text_summary")
    ]
    assert texts == [(it, f"**turn** {it}") for it in range(3)]


def test_null_monitor_writes_nothing(tmp_path):
    mon = NullMonitor(tmp_path / "tb")
    mon.scalars("a", {"b": 1.0}, 0)
    mon.histogram("h", [1.0], 0)
    mon.text("t", "x", 0)
    assert list(mon.progress([1, 2])) == [1, 2]
    mon.close()
    assert not (tmp_path / "tb").exists()
