"""An optional Weights & Biases sink beside TensorBoard (`monitor.wandb`, off by default).

`WandbSink(inner, wandb_cfg, ...)` is a monitor that passes every call on to `inner` (the TensorBoard `Monitor`, or
a `NullMonitor` with `monitor.tensorboard: false`) and sends the same scalars, histograms and text to one W&B run,
so the driver loop logs once and never branches. x is the step the loop gives, as in TensorBoard (W&B's own
`_step` only counts calls); text goes in as preformatted HTML. Offline mode (the default) writes only files,
`RUN_DIR/wandb/offline-run-*/run-*.wandb`, and needs no network; `wandb sync` uploads them later. wandb is imported
only when a run opens the sink: commands that do not log never import it.

    monitor = WandbSink(Monitor(log_dir), cfg.monitor.wandb, name=cfg.name, run_dir=cfg.run_dir, config=plain)
    monitor.scalars("reward", {"mean": 0.5}, step=3)
    monitor.close()                                        # closes the inner monitor too
    read_history(run_dir / "wandb")                        # the logged rows, for tests and reports
"""

from __future__ import annotations

import html
import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from swe_megatron.config.schema import WandbConfig
from swe_megatron.errors import UsageError
from swe_megatron.monitor.tensorboard import Monitor, T, _finite

STEP_KEY = "step"
"""The history key holding the loop's step; every other metric is plotted against it (define_metric)."""


def _import_wandb():
    try:
        import wandb
    except ImportError as e:
        raise UsageError(
            f"monitor.wandb.enabled=true but wandb does not import ({e}): pip install wandb "
            "(or .venv/bin/pip install 'swe-megatron[wandb]'), or set monitor.wandb.enabled=false"
        ) from None
    return wandb


class WandbSink(Monitor):
    """A monitor that logs to W&B and passes every call on to `inner` (rank 0 only, like the TensorBoard one)."""

    def __init__(self, inner: Monitor, wandb_cfg: WandbConfig, name: str, run_dir: str | Path, config: dict):
        wandb = _import_wandb()
        self.inner = inner
        self.log_dir = inner.log_dir
        self.progress_enabled = inner.progress_enabled
        self._wandb = wandb
        mode = getattr(wandb_cfg.mode, "value", wandb_cfg.mode)
        root = Path(wandb_cfg.dir or run_dir)
        root.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                project=wandb_cfg.project,
                name=name,
                group=name,  # a resumed run is a new W&B run of the same group
                dir=str(root),
                mode=mode,
                config=config,
                # console="off": the run's own console lines stay as they are (no stdout wrapping)
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as e:  # wandb's errors (login, network) differ by version: one line names the fix
            raise UsageError(
                f"monitor.wandb: W&B did not start a {mode} run ({type(e).__name__}: {e}); "
                "set monitor.wandb.mode=offline to log without network"
            ) from None
        self._run.define_metric("*", step_metric=STEP_KEY)
        where = Path(self._run.dir).parent if mode == "offline" else self._run.url
        print(f"run: W&B {mode} run {self._run.id} in {where}", flush=True)

    def _log(self, row: dict, step: int) -> None:
        if row:
            self._run.log({**row, STEP_KEY: step})

    def scalars(self, group: str, values: Mapping[str, Any], step: int) -> None:
        """Log every finite numeric value as `group/name` (None and NaN skipped), in TensorBoard and W&B."""
        self.inner.scalars(group, values, step)
        row = {f"{group}/{k}": f for k, v in values.items() if (f := _finite(v)) is not None}
        self._log(row, step)

    def layout(self, layout: dict) -> None:
        """TensorBoard's Custom Scalars layout (W&B arranges its own panels from the `key/<stage>/` tags)."""
        self.inner.layout(layout)

    def histogram(self, tag: str, values: Iterable[float], step: int) -> None:
        """Log a histogram of values (skipped when empty)."""
        data = [float(v) for v in values]
        self.inner.histogram(tag, data, step)
        if data:
            self._log({tag: self._wandb.Histogram(data)}, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Log text (a trajectory, the eval table) as preformatted HTML."""
        self.inner.text(tag, text, step)
        self._log({tag: self._wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step)

    def progress(self, items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        """The inner monitor's progress bar."""
        yield from self.inner.progress(items, total=total, desc=desc)

    def flush(self) -> None:
        """Flush the inner monitor (W&B writes as it goes)."""
        self.inner.flush()

    def close(self) -> None:
        """Finish the W&B run and close the inner monitor."""
        self._run.finish()
        # finish() can return before wandb's service has written the run's .wandb file out (seen: 7 bytes, then
        # complete a moment later); teardown waits for it, so the files are whole when the driver goes on or exits.
        self._wandb.teardown()
        self.inner.close()


_LOG_HEADER = 7  # ":W&B", a 2-byte magic and a version byte
_BLOCK = 32768
_FULL, _LAST = 1, 4


def read_records(wandb_dir: str | Path) -> Iterator[Any]:
    """Every protobuf Record (wandb_internal_pb2.Record: run, history, summary, ...) of the run-*.wandb files under
    wandb_dir, in order (for tests and reports).

    A .wandb file is a LevelDB-style log (a 7-byte file header, 32 KiB blocks, each chunk a 7-byte header: crc32,
    length, type); wandb 0.31 reads it only from its Go core, so it is read here."""
    from wandb.proto import wandb_internal_pb2 as pb

    for path in sorted(Path(wandb_dir).rglob("run-*.wandb")):
        data, pos, record = path.read_bytes(), _LOG_HEADER, b""
        while pos + 7 <= len(data):
            if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
                pos += _BLOCK - pos % _BLOCK
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0 and length == 0:
                break
            record += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (_FULL, _LAST):
                rec = pb.Record()
                rec.ParseFromString(record)
                record = b""
                yield rec


def read_history(wandb_dir: str | Path) -> list[dict[str, Any]]:
    """The history rows ({key: value}, values decoded from JSON; a histogram's or a file's fields flattened as
    `tag/values`, `tag/path`, ...) of the runs under wandb_dir, in order."""
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
        for rec in read_records(wandb_dir)
        if rec.WhichOneof("record_type") == "history"
    ]
