"""PNG plots of tools/sim_scale.py figures (docs/benchmarks.md, "Scale"), drawn with Pillow (matplotlib is not in
the project's environment): one panel per measure against episodes in flight, a line per JSON file (before /
after a fix).

    .venv/bin/python tools/plot_scale.py docs/scale_before.json docs/scale_after.json --out docs/scale.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw

PANELS = [
    ("episodes_per_min", "episodes / min"),
    ("cpu_ms_per_turn", "controller CPU ms / turn"),
    ("added_ms_per_generate_p50", "added ms / turn, p50"),
    ("added_ms_per_generate_p99", "added ms / turn, p99"),
    ("mb_per_episode_in_flight", "MiB / episode in flight"),
    ("sockets_peak", "open sockets (peak)"),
]
COLORS = [(200, 60, 40), (30, 110, 200), (40, 150, 60), (140, 60, 170)]
W, H, PAD = 360, 240, 44


def panel(
    draw: ImageDraw.ImageDraw, x0: int, y0: int, key: str, title: str, series: list[tuple[str, list]]
) -> None:
    """One measure against concurrency, each series a polyline with dots, axes labelled with min/max."""
    pts = [(r["concurrency"], r[key]) for _, rows in series for r in rows if r.get(key) is not None]
    if not pts:
        return
    xs, ys = sorted({p[0] for p in pts}), [p[1] for p in pts]
    ymax = max(ys) * 1.1 or 1.0
    left, right, top, bottom = x0 + PAD, x0 + W - 12, y0 + 24, y0 + H - 28
    draw.text((x0 + PAD, y0 + 4), title, fill="black")
    draw.line([(left, top), (left, bottom), (right, bottom)], fill="black")
    span = max(1, len(xs) - 1)

    def at(x, y):
        return left + (right - left) * xs.index(x) / span if len(xs) > 1 else (left + right) / 2, bottom - (
            bottom - top
        ) * y / ymax

    for x in xs:
        px, _ = at(x, 0)
        draw.text((px - 8, bottom + 4), str(x), fill="black")
    draw.text((x0 + 2, top - 4), f"{ymax / 1.1:.3g}", fill="black")
    draw.text((x0 + 2, bottom - 10), "0", fill="black")
    for color, (_, rows) in zip(COLORS, series):
        line = [at(r["concurrency"], r[key]) for r in rows if r.get(key) is not None]
        if len(line) > 1:
            draw.line(line, fill=color, width=2)
        for px, py in line:
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=color)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="sim_scale.py --json outputs (one line each)")
    p.add_argument("--out", required=True, help="PNG file")
    args = p.parse_args()
    series = [(Path(f).stem, json.loads(Path(f).read_text())["levels"]) for f in args.files]
    cols = 3
    img = Image.new("RGB", (cols * W, ((len(PANELS) + cols - 1) // cols) * H + 24), "white")
    draw = ImageDraw.Draw(img)
    for i, (key, title) in enumerate(PANELS):
        panel(draw, (i % cols) * W, (i // cols) * H, key, title, series)
    y = img.height - 18
    for j, (name, _) in enumerate(series):
        draw.rectangle([10 + 160 * j, y + 2, 22 + 160 * j, y + 12], fill=COLORS[j % len(COLORS)])
        draw.text((28 + 160 * j, y), name, fill="black")
    img.save(args.out)


if __name__ == "__main__":
    main()
