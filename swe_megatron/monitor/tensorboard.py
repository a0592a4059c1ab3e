"""Run monitoring: TensorBoard scalars, histograms and trajectory text, and terminal progress bars.

`Monitor` writes event files under `<run_dir>/tensorboard/<config name>` (TensorBoard names the run after the
config); `NullMonitor` has the same methods and does nothing (non-zero ranks, tests), so the driver loop never
branches on whether it logs. `key_curves` are the few curves a run is judged by, logged per stage as
`0_key/<stage>/<curve>` (first in the Scalars and Time Series tabs) and pinned by `key_layout` in TensorBoard's
Custom Scalars tab (one line per stage, so where a stage begins shows). Text (sample trajectories, the run's
config) is markdown, its code blocks fenced by `fenced` so that code fences inside cannot end them early.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

KEY_CURVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "resolved_rate": ("resolved rate", ("reward/resolved_rate", "warm_start/resolved_rate")),
    "give_up_rate": ("give-ups (submitted without a change)", ("episode/give_up_rate",)),
    "loss": (
        "loss (SFT in warm start (its last epoch) and rft, DAPO in stage1/stage2)",
        ("warm_start/final_epoch_loss", "train/sft_loss", "train/dapo_loss"),
    ),
    "steps_mean": ("turns per episode", ("episode/steps_mean",)),
    "tokens_mean": ("tokens per trajectory", ("tokens/trajectory_mean",)),
    "logprob_mismatch": ("engine vs trainer |logprob| mismatch", ("train/logprob_mismatch_abs_mean",)),
    "staleness_mean": ("staleness (updates behind the trainer)", ("async/staleness_mean",)),
}
"""Curve -> (chart title, the group/name tags it is read from, first present wins)."""

KEY_GROUP = "0_key"
"""The key curves' tag group (`0_key/<stage>/<curve>`). TensorBoard's Scalars and Time Series tabs sort groups by
name, and every other group is a lowercase word: the leading digit puts the key curves first, not in the middle."""


def fenced(text: str, info: str = "") -> str:
    """`text` as one markdown code block whose fence is longer than any run of backticks in it, so that a code
    fence inside (an agent's ```bash block) neither ends the block nor opens another (CommonMark, and the
    Python-Markdown fenced_code that TensorBoard renders with, close a block only with its own fence)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def sample_text(unit: str, rendered: str) -> str:
    """The TensorBoard text of one sample trajectory of `unit` (rendered by rollout.command.render_trajectory,
    cut to 20,000 characters): the unit, then the trajectory verbatim in a code block."""
    return f"{unit}\n\n{fenced(rendered[:20000])}"


def key_curves(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The KEY_CURVES values present in one unit's metrics ({group: {name: value}})."""
    out = {}
    for curve, (_, sources) in KEY_CURVES.items():
        for tag in sources:
            group, name = tag.split("/", 1)
            if _finite(metrics.get(group, {}).get(name)) is not None:
                out[curve] = metrics[group][name]
                break
    return out


def key_layout(stages: list[str], async_on: bool) -> dict:
    """The Custom Scalars layout (SummaryWriter.add_custom_scalars) pinning KEY_CURVES: one chart per curve,
    one line per stage (`0_key/<stage>/<curve>`, stages in schedule order), staleness only when async is on."""
    names = "|".join(stages)
    charts = {
        title: ["Multiline", [f"^{KEY_GROUP}/({names})/{curve}$"]]
        for curve, (title, _) in KEY_CURVES.items()
        if curve != "staleness_mean" or async_on
    }
    return {"key curves per stage": charts}


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class Monitor:
    """TensorBoard writer for one run; tags are "<group>/<name>" and x is the global iteration."""

    def __init__(self, log_dir: str | Path, progress: bool = True):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        from torch.utils.tensorboard import SummaryWriter  # torch: not for commands that only parse

        self._writer = SummaryWriter(str(self.log_dir))
        self.progress_enabled = progress

    def scalars(self, group: str, values: Mapping[str, Any], step: int) -> None:
        """Log every finite numeric value as `group/name`; None and NaN are skipped, not written as 0."""
        for name, value in values.items():
            f = _finite(value)
            if f is not None:
                self._writer.add_scalar(f"{group}/{name}", f, step)

    def layout(self, layout: dict) -> None:
        """Pin charts in TensorBoard's Custom Scalars tab ({category: {title: ["Multiline", [tag regexes]]}})."""
        self._writer.add_custom_scalars(layout)

    def histogram(self, tag: str, values: Iterable[float], step: int) -> None:
        """Log a histogram of values (skipped when empty)."""
        data = [float(v) for v in values]
        if data:
            import numpy as np

            self._writer.add_histogram(tag, np.asarray(data), step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Log text (markdown) such as a sample trajectory."""
        self._writer.add_text(tag, text, step)

    def progress(self, items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        """Iterate with a terminal progress bar (tqdm) when enabled."""
        if not self.progress_enabled:
            yield from items
            return
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, dynamic_ncols=True, leave=False)

    def flush(self) -> None:
        """Write pending events to disk (call at the end of each iteration, before the checkpoint)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class NullMonitor(Monitor):
    """A Monitor that records nothing (same signatures)."""

    def __init__(self, log_dir: str | Path | None = None, progress: bool = False):
        self.log_dir = Path(log_dir) if log_dir else None
        self.progress_enabled = progress

    def scalars(self, group: str, values: Mapping[str, Any], step: int) -> None:
        """Drop the values."""

    def layout(self, layout: dict) -> None:
        """Drop the layout."""

    def histogram(self, tag: str, values: Iterable[float], step: int) -> None:
        """Drop the values."""

    def text(self, tag: str, text: str, step: int) -> None:
        """Drop the text."""

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under log_dir: tag -> [(step, value)], for tests and reports."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
