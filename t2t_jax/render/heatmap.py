"""Valid / optimal rates over agents x map size as a heatmap PNG (one panel per metric)."""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw

from t2t_jax.render.board import TEXT, load_font


def _shade(rate: float) -> tuple:
    """0 -> pale red, 1 -> green."""
    r = max(0.0, min(1.0, rate))
    return (int(245 - 200 * r), int(215 + 25 * r) - int(60 * (1 - r)), int(210 - 120 * r))


def rate_heatmap(
    cells: Sequence[dict], metrics: Sequence[str] = ("valid", "optimal"), title: str = "", cell: int = 44
) -> Image.Image:
    """cells: dicts with `agents`, `size` and each metric (0..1); empty cells stay blank."""
    agents = sorted({c["agents"] for c in cells})
    sizes = sorted({c["size"] for c in cells})
    at = {(c["agents"], c["size"]): c for c in cells}
    left, top, gap = 70, 48, 24
    panel_w = cell * len(sizes)
    img = Image.new("RGB", (left + len(metrics) * (panel_w + gap), top + cell * len(agents) + 28), "white")
    draw = ImageDraw.Draw(img)
    font, small = load_font(14), load_font(11)
    draw.text((8, 6), title, fill=TEXT, font=font)
    for m, metric in enumerate(metrics):
        x0 = left + m * (panel_w + gap)
        draw.text((x0, 26), f"{metric} rate", fill=TEXT, font=font)
        for j, n in enumerate(sizes):
            draw.text((x0 + j * cell + 8, top + cell * len(agents) + 6), f"{n}x{n}", fill=TEXT, font=small)
        for i, k in enumerate(agents):
            if m == 0:
                draw.text((8, top + i * cell + cell // 3), f"{k} agents", fill=TEXT, font=small)
            for j, n in enumerate(sizes):
                box = (x0 + j * cell, top + i * cell, x0 + (j + 1) * cell - 2, top + (i + 1) * cell - 2)
                c = at.get((k, n))
                if c is None:
                    draw.rectangle(box, outline=(220, 220, 220))
                    continue
                draw.rectangle(box, fill=_shade(c[metric]))
                draw.text((box[0] + 6, box[1] + cell // 3), f"{100 * c[metric]:.0f}%", fill=TEXT, font=small)
    return img
