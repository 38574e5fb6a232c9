"""Paired differences with their intervals as a forest plot PNG (one panel per comparison).

    image = forest_plot([("monitor vs warm start", [("grpo", 0.044, 0.024, 0.065, 0.0002), ...]),
                         ("benchmark vs warm start", [...])], title="Study, seeds [0, 1]")

Each row is (label, difference, low, high, p) with the rates as fractions, or (label, difference,
low, high, p, note) where `note` is the text written at the right of the row; the axis is in
points (%), shared by all panels, with 0 marked. A panel is (title, rows) or (title, rows, alpha),
its own significance level (launch.study: 0.05 for the tests across runs, 0.01 for the
board-pooled ones). A row significant at p < alpha is drawn dark, the others grey; the figure
and p (or the note) are written at the right of each row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from PIL import Image, ImageDraw

from t2t_jax.render.board import TEXT, load_font

SIGNIFICANT, OTHER, ZERO, GRID = (31, 78, 140), (150, 150, 150), (200, 60, 60), (232, 232, 232)

Row = tuple[str, float, float, float, float] | tuple[str, float, float, float, float, str]


def _ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (points) spanning [lo, hi]: steps of 1, 2, 5 x 10^k, about 5 of them."""
    raw = (hi - lo) / 5 or 1.0
    step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    return [i * step for i in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def _p(p: float) -> str:
    return "p<0.0001" if p < 1e-4 else f"p={p:.4f}"


def _with_note(row: Row) -> tuple[str, float, float, float, float, str]:
    """A row with its note: the given one, else the difference and p."""
    return (*row[:5], row[5] if len(row) > 5 else f"{100 * row[1]:+.2f}  {_p(row[4])}")


def forest_plot(
    panels: Sequence[tuple[str, Sequence[Row]] | tuple[str, Sequence[Row], float]],
    title: str = "",
    alpha: float = 0.01,
    width: int = 300,
    columns: int = 2,
) -> Image.Image:
    """panels: (panel title, rows[, alpha]), laid out `columns` to a line; rows as in the module
    docstring; `alpha` for the panels that give none. -> an RGB image."""
    panels = [(p[0], [_with_note(r) for r in p[1]], p[2] if len(p) > 2 else alpha) for p in panels]
    labels = [r[0] for _, rows, _ in panels for r in rows]
    if not labels:
        raise ValueError("forest_plot: no rows to draw")
    values = [100 * v for _, rows, _ in panels for r in rows for v in r[1:4]] + [0.0]
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo or 1.0)
    lo, hi = lo - pad, hi + pad
    notes = [r[5] for _, rows, _ in panels for r in rows]
    row_h, head, label_w, gap = 22, 50, 14 + 7 * max(len(s) for s in labels), 16
    note_w = max(130, 16 + 6 * max(len(s) for s in notes))
    rows_n = max(len(rows) for _, rows, _ in panels)
    panel_w, panel_h = label_w + width + note_w, head + rows_n * row_h + 40
    columns = max(1, min(columns, len(panels)))
    lines = -(-len(panels) // columns)
    img = Image.new("RGB", (columns * (panel_w + gap), 24 + lines * panel_h), "white")
    draw = ImageDraw.Draw(img)
    big, small = load_font(14), load_font(11)
    draw.text((8, 6), title, fill=TEXT, font=big)

    for k, (name, rows, level) in enumerate(panels):
        x0 = (k % columns) * (panel_w + gap) + label_w
        top = 24 + (k // columns) * panel_h + head - 26

        def x(v, x0=x0):
            return x0 + (100 * v - lo) / (hi - lo) * width

        bottom = top + rows_n * row_h
        draw.text((x0, top - 22), name, fill=TEXT, font=big)
        for t in _ticks(lo, hi):
            px = x0 + (t - lo) / (hi - lo) * width
            draw.line((px, top, px, bottom), fill=GRID)
            draw.text((px - 8, bottom + 4), f"{t:+g}" if t else "0", fill=TEXT, font=small)
        draw.text((x0 + width // 2 - 20, bottom + 18), "points (%)", fill=TEXT, font=small)
        draw.line((x(0.0), top - 4, x(0.0), bottom), fill=ZERO, width=1)
        for i, (label, diff, low, high, p, note) in enumerate(rows):
            y = top + i * row_h + row_h // 2
            colour = SIGNIFICANT if p < level else OTHER
            draw.text((x0 - label_w + 6, y - 7), label, fill=TEXT, font=small)
            draw.line((x(low), y, x(high), y), fill=colour, width=2)
            for end in (low, high):
                draw.line((x(end), y - 4, x(end), y + 4), fill=colour, width=2)
            draw.ellipse((x(diff) - 4, y - 4, x(diff) + 4, y + 4), fill=colour)
            draw.text((x0 + width + 8, y - 7), note, fill=colour, font=small)
    return img
