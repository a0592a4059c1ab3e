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


def test_key_curves_per_stage_and_their_custom_scalars_layout(tmp_path):
    """The key curves of a unit's metrics, and the Custom Scalars layout that pins them, as TensorBoard's own
    custom_scalars plugin reads it back (layout_pb2): one chart per curve, one line per stage; staleness only
    with async on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    from swe_megatron.monitor import key_curves, key_layout

    metrics = {
        "reward": {"resolved_rate": 0.5},
        "train": {"dapo_loss": -0.1, "logprob_mismatch_abs_mean": 1e-6},
        "episode": {"steps_mean": 3.0},
        "tokens": {"trajectory_mean": 900.0},
        "async": {"staleness_mean": float("nan")},
    }
    assert key_curves(metrics) == {
        "resolved_rate": 0.5, "loss": -0.1, "steps_mean": 3.0, "tokens_mean": 900.0, "logprob_mismatch": 1e-6,
    }  # fmt: skip
    assert key_curves({"warm_start": {"resolved_rate": 1.0}, "train": {"sft_loss": 2.0}}) == {
        "resolved_rate": 1.0, "loss": 2.0,
    }  # fmt: skip
    for async_on in (False, True):
        mon = Monitor(tmp_path / f"tb{async_on}", progress=False)
        mon.layout(key_layout(["warm_start", "rft", "stage1", "stage2"], async_on))
        mon.close()
        (events,) = (tmp_path / f"tb{async_on}").rglob("events.out.tfevents.*")
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        (event,) = acc.Tensors("custom_scalars__config__")
        layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
        (category,) = layout.category
        charts = {c.title: list(c.multiline.tag) for c in category.chart}
        assert charts["resolved rate"] == ["^0_key/(warm_start|rft|stage1|stage2)/resolved_rate$"]
        assert any("loss" in t for t in charts) and ("staleness_mean" in str(charts)) == async_on


def test_readme_lists_every_key_curve_and_each_of_its_tags_once():
    """README's TensorBoard paragraph names every key curve (monitor.KEY_CURVES) and every tag it reads; the
    pipeline e2e test compares the whole list with the tags a run writes."""
    from readme_tags import matches, readme_tag_patterns

    from swe_megatron.monitor import KEY_CURVES

    patterns = readme_tag_patterns()
    assert len(patterns) == len(set(patterns)), "a tag listed twice"
    for curve, (_, sources) in KEY_CURVES.items():
        assert f"0_key/<stage>/{curve}" in patterns
        assert all(any(matches(tag, p) for p in patterns) for tag in sources), sources
    assert not any(matches("train/loss", p) for p in patterns if "*" not in p)


def test_the_key_curves_sort_before_every_other_group():
    """TensorBoard's Scalars and Time Series tabs sort tag groups by name: the key curves' group comes before
    every group README lists (all that a run writes), by code point and case-blind alike."""
    from readme_tags import readme_tag_patterns

    from swe_megatron.monitor import KEY_GROUP

    groups = {p.split("/")[0] for p in readme_tag_patterns()}
    assert KEY_GROUP in groups and len(groups) > 10
    assert sorted(groups)[0] == KEY_GROUP and sorted(groups, key=str.lower)[0] == KEY_GROUP


def test_a_sample_holding_code_fences_renders_as_one_code_block():
    """An agent's turn holds ```bash blocks: the sample's text must stay one code block as TensorBoard renders
    it (its own markdown), not end at the first inner fence and render the rest as markdown."""
    from tensorboard.plugin_util import markdown_to_safe_html

    from swe_megatron.monitor import sample_text

    rendered = "── assistant [turn 0] ──\nLook:\n```bash\ncat a.py\n```\n# not a heading\n````\n**not bold**"
    html = markdown_to_safe_html(sample_text("stage1:3", rendered))
    assert html.count("<pre>") == 1 and "<h1>" not in html and "<strong>" not in html, html
    assert "```bash" in html and "**not bold**" in html and "stage1:3" in html.split("<pre>")[0], html


def test_a_fresh_run_logs_its_config_as_text(tmp_path):
    """The resolved config, as YAML in one code block at step 0, under the `config` text tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from swe_megatron.config.load import load_config
    from swe_megatron.pipeline.run_dir import RunDir, open_monitor

    cfg = load_config("embedded", [f"run_dir={tmp_path / 'run'}", "monitor.progress=false"])
    monitor = open_monitor(RunDir(tmp_path / "run"), cfg)
    monitor.close()
    (events,) = (tmp_path / "run" / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
    acc.Reload()
    ((step, text),) = [
        (e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("config/text_summary")
    ]
    assert step == 0 and text.startswith("```yaml\n") and f"run_dir: {tmp_path / 'run'}" in text, text
