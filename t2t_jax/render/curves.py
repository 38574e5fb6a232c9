"""Rates over map size with their intervals as a PNG: one panel per (agents table, metric), one
line per model (the paper's table as a figure, `launch.table`).

    image = rate_curves([("3 agents: acc.", [("base", [3, 4], [40.0, 24.0], [32.5, 17.9], [47.9, 31.4], False)])])

A series is (label, sizes, rates, lows, highs, reference) in %; reference series (the paper's
published rows) are drawn thin and pale, the others bold with their interval as whiskers. The
legend lists every series once, in the order of the first panel that has it.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw

from t2t_jax.render.board import AGENT_COLOURS, TEXT, load_font

GRID = (232, 232, 232)

Series = tuple[str, Sequence[int], Sequence[float], Sequence[float], Sequence[float], bool]


def _pale(colour: tuple) -> tuple:
    return tuple(int(c + (255 - c) * 0.55) for c in colour)


def rate_curves(
    panels: Sequence[tuple[str, Sequence[Series]]], title: str = "", width: int = 320, height: int = 220
) -> Image.Image:
    """panels: (title, series), two to a line, y from 0 to 100%. -> an RGB image."""
    labels = list(dict.fromkeys(s[0] for _, series in panels for s in series))
    if not labels:
        raise ValueError("rate_curves: no series to draw")
    reference = {s[0]: s[5] for _, series in panels for s in series}
    colour = {label: AGENT_COLOURS[i % len(AGENT_COLOURS)] for i, label in enumerate(labels)}
    left, top, gap, columns = 44, 40, 36, 2
    lines = -(-len(panels) // columns)
    legend_w = 24 + 7 * max(len(label) for label in labels)
    panel_w, panel_h = width + left + gap, height + top + 30
    img = Image.new("RGB", (columns * panel_w + legend_w, max(lines * panel_h + 30, 30 + 16 * len(labels))), "white")
    draw = ImageDraw.Draw(img)
    big, small = load_font(14), load_font(11)
    draw.text((8, 6), title, fill=TEXT, font=big)
    for k, (name, series) in enumerate(panels):
        x0, y0 = (k % columns) * panel_w + left, 30 + (k // columns) * panel_h + top
        sizes = sorted({n for s in series for n in s[1]})

        def x(n, x0=x0, sizes=sizes):
            return x0 + (sizes.index(n) + 0.5) * width / max(len(sizes), 1)

        def y(v, y0=y0):
            return y0 + height * (1 - v / 100)

        draw.text((x0, y0 - 24), name, fill=TEXT, font=big)
        for v in range(0, 101, 20):
            draw.line((x0, y(v), x0 + width, y(v)), fill=GRID)
            draw.text((x0 - 30, y(v) - 6), f"{v}%", fill=TEXT, font=small)
        for n in sizes:
            draw.text((x(n) - 12, y0 + height + 6), f"{n}x{n}", fill=TEXT, font=small)
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
