"""Rates with their intervals as a PNG: one panel per (agents table, metric), one line per model
over map size (the paper's table as a figure, `launch.table`), or one line per arm over a study's
evaluation points (`launch.study`'s study_curves.png).

    image = rate_curves([("3 agents: acc.", [("base", [3, 4], [40.0, 24.0], [32.5, 17.9], [47.9, 31.4], False)])])
    image = rate_curves([("target", series, (-2.0, 4.0))], x_label=str)   # a panel's own y range

A series is (label, xs, rates, lows, highs, reference) in %; reference series (the paper's
published rows) are drawn thin and pale, the others bold with their interval as whiskers. A
panel is (title, series) with y from 0 to 100%, or (title, series, (y_lo, y_hi)). The legend
lists every series once, in the order of the first panel that has it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from PIL import Image, ImageDraw

from t2t_jax.render.board import AGENT_COLOURS, TEXT, load_font

GRID = (232, 232, 232)

Series = tuple[str, Sequence[int], Sequence[float], Sequence[float], Sequence[float], bool]


def _pale(colour: tuple) -> tuple:
    return tuple(int(c + (255 - c) * 0.55) for c in colour)


def _ticks(lo: float, hi: float) -> list[float]:
    """About five round values from lo to hi."""
    raw = (hi - lo) / 5
    step = min((m * 10.0**e for e in range(-3, 4) for m in (1, 2, 2.5, 5) if m * 10.0**e >= raw), default=raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 6) for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def rate_curves(
    panels: Sequence[tuple], title: str = "", width: int = 320, height: int = 220, x_label=lambda n: f"{n}x{n}"
) -> Image.Image:
    """panels: (title, series[, (y_lo, y_hi)]), two to a line, y in % (0 to 100 unless given);
    `x_label(x)`: the text under each x. -> an RGB image."""
    panels = [(p[0], p[1], p[2] if len(p) > 2 else (0.0, 100.0)) for p in panels]
    labels = list(dict.fromkeys(s[0] for _, series, _ in panels for s in series))
    if not labels:
        raise ValueError("rate_curves: no series to draw")
    reference = {s[0]: s[5] for _, series, _ in panels for s in series}
    colour = {label: AGENT_COLOURS[i % len(AGENT_COLOURS)] for i, label in enumerate(labels)}
    left, top, gap, columns = 50, 40, 36, 2
    lines = -(-len(panels) // columns)
    legend_w = 24 + 7 * max(len(label) for label in labels)
    panel_w, panel_h = width + left + gap, height + top + 30
    img = Image.new("RGB", (columns * panel_w + legend_w, max(lines * panel_h + 30, 30 + 16 * len(labels))), "white")
    draw = ImageDraw.Draw(img)
    big, small = load_font(14), load_font(11)
    draw.text((8, 6), title, fill=TEXT, font=big)
    for k, (name, series, (lo, hi)) in enumerate(panels):
        x0, y0 = (k % columns) * panel_w + left, 30 + (k // columns) * panel_h + top
        sizes = sorted({n for s in series for n in s[1]})

        def x(n, x0=x0, sizes=sizes):
            return x0 + (sizes.index(n) + 0.5) * width / max(len(sizes), 1)

        def y(v, y0=y0, lo=lo, hi=hi):
            return y0 + height * (1 - (v - lo) / (hi - lo))

        draw.text((x0, y0 - 24), name, fill=TEXT, font=big)
        for v in _ticks(lo, hi):
            draw.line((x0, y(v), x0 + width, y(v)), fill=(150, 150, 150) if v == 0 and lo < 0 else GRID)
            draw.text((x0 - 40, y(v) - 6), f"{v:g}%", fill=TEXT, font=small)
        for n in sizes:
            draw.text((x(n) - 12, y0 + height + 6), x_label(n), fill=TEXT, font=small)
        for label, ns, rates, lows, highs, ref in sorted(series, key=lambda s: not s[5]):
            c = _pale(colour[label]) if ref else colour[label]
            points = [(x(n), y(r)) for n, r in zip(ns, rates)]
            if len(points) > 1:
                draw.line(points, fill=c, width=1 if reference else 2)
            for (px, py), lo, hi in zip(points, lows, highs):
                if not ref:
                    draw.line((px, y(lo), px, y(hi)), fill=c, width=1)
                draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=c)
    lx = columns * panel_w
    for i, label in enumerate(labels):
        fill = _pale(colour[label]) if reference[label] else colour[label]
        draw.rectangle((lx, 34 + 16 * i, lx + 10, 44 + 16 * i), fill=fill)
        draw.text((lx + 16, 32 + 16 * i), label, fill=TEXT, font=small)
    return img
