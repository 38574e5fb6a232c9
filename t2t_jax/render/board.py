"""Boards as PNG, executed plans as animated GIF or a strip of frames, grids of boards.

Boards and plans are the interchange forms of t2t_jax.env.io (a board dict; a plan as one list
of action names per agent). Frozen cells are pale blue, holes dark blue; agent i is a disc of
AGENT_COLOURS[i] with its number and its goal a square outline of the same colour. In plan
frames, a red ring marks an agent that left the grid or entered a hole in that step and a red
cross a vertex or edge collision, where it happened.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from t2t_jax.env.reference import trajectory

ICE, HOLE, LINE, TEXT, BAD = (219, 238, 250), (27, 58, 92), (160, 190, 210), (30, 30, 30), (220, 20, 20)
AGENT_COLOURS = (
    (230, 126, 34),
    (46, 160, 67),
    (142, 68, 173),
    (231, 76, 60),
    (241, 196, 15),
    (26, 188, 156),
    (52, 73, 94),
    (236, 112, 180),
    (127, 140, 141),
    (121, 85, 72),
)
LEGEND_ROW = 16


def load_font(size):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _colour(i):
    return AGENT_COLOURS[i % len(AGENT_COLOURS)]


def board_image(
    board: dict,
    cell: int = 40,
    positions: Sequence | None = None,
    events: Sequence = (),
    title: str | None = None,
    legend: bool = True,
) -> Image.Image:
    """One board (agents at `positions`, default their starts) as an RGB image.

    Size: (N * cell) wide, N * cell + legend/title rows high."""
    n, k = board["size"], len(board["starts"])
    positions = [tuple(p) for p in (positions if positions is not None else board["starts"])]
    top = LEGEND_ROW if title else 0
    bottom = LEGEND_ROW * k if legend else 0
    img = Image.new("RGB", (n * cell, top + n * cell + bottom), "white")
    draw = ImageDraw.Draw(img)
    holes = {tuple(h) for h in board["holes"]}
    for r in range(n):
        for c in range(n):
            box = (c * cell, top + r * cell, (c + 1) * cell - 1, top + (r + 1) * cell - 1)
            draw.rectangle(box, fill=HOLE if (r, c) in holes else ICE, outline=LINE)
    font = load_font(max(10, cell // 3))
    for i, (gr, gc) in enumerate(board["goals"]):
        pad = max(2, cell // 10)
        draw.rectangle(
            (gc * cell + pad, top + gr * cell + pad, (gc + 1) * cell - pad - 1, top + (gr + 1) * cell - pad - 1),
            outline=_colour(i),
            width=max(2, cell // 12),
        )
    for i, (r, c) in enumerate(positions):
        pad = max(3, cell // 5)
        draw.ellipse(
            (c * cell + pad, top + r * cell + pad, (c + 1) * cell - pad - 1, top + (r + 1) * cell - pad - 1),
            fill=_colour(i),
        )
        draw.text((c * cell + cell / 2, top + r * cell + cell / 2), str(i), fill="white", font=font, anchor="mm")
    for kind, cells in events:
        for r, c in cells:
            if not (0 <= r < n and 0 <= c < n):
                continue
            x0, y0, x1, y1 = c * cell + 2, top + r * cell + 2, (c + 1) * cell - 3, top + (r + 1) * cell - 3
            if kind in ("vertex_collision", "edge_collision"):
                draw.line((x0, y0, x1, y1), fill=BAD, width=3)
                draw.line((x0, y1, x1, y0), fill=BAD, width=3)
            else:
                draw.ellipse((x0, y0, x1, y1), outline=BAD, width=3)
    small = load_font(11)
    if title:
        draw.text((3, 2), title, fill=TEXT, font=small)
    if legend:
        for i, (s, g) in enumerate(zip(board["starts"], board["goals"])):
            y = top + n * cell + i * LEGEND_ROW + 2
            draw.rectangle((3, y + 2, 12, y + 11), fill=_colour(i))
            draw.text((16, y), f"{i}: ({s[0]},{s[1]})->({g[0]},{g[1]})", fill=TEXT, font=small)
    return img


def plan_frames(board: dict, plan: Sequence, cell: int = 40) -> list[Image.Image]:
    """One image per time step of the executed plan (t = 0 .. T), violations marked."""
    run = trajectory(board, list(plan))
    frames = []
    for t, positions in enumerate(run["positions"]):
        events = [(kind, cells) for when, kind, cells, _ in run["events"] if when == t]
        frames.append(board_image(board, cell, positions, events, title=f"t = {t}"))
    return frames


def plan_strip(board: dict, plan: Sequence, cell: int = 32, gap: int = 6) -> Image.Image:
    """The frames of `plan_frames` side by side."""
    frames = plan_frames(board, plan, cell)
    w, h = frames[0].size
    strip = Image.new("RGB", (len(frames) * (w + gap) - gap, h), "white")
    for i, f in enumerate(frames):
        strip.paste(f, (i * (w + gap), 0))
    return strip


def save_gif(board: dict, plan: Sequence, path: str, cell: int = 40, ms: int = 500) -> None:
    """The executed plan as an animated GIF (the last frame held twice as long)."""
    frames = plan_frames(board, plan, cell)
    durations = [ms] * (len(frames) - 1) + [2 * ms]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0)


def boards_grid(
    boards: Sequence[dict], cols: int = 4, cell: int = 24, gap: int = 8, titles: Sequence[str] | None = None
) -> Image.Image:
    """Several boards in a grid, each at its own size, with optional titles."""
    imgs = [
        board_image(b, cell, title=(titles[i] if titles else f"board {i}"), legend=False) for i, b in enumerate(boards)
    ]
    cols = max(1, min(cols, len(imgs)))
    rows = -(-len(imgs) // cols)
    w = max(i.size[0] for i in imgs) + gap
    h = max(i.size[1] for i in imgs) + gap
    grid = Image.new("RGB", (cols * w, rows * h), "white")
    for j, img in enumerate(imgs):
        grid.paste(img, ((j % cols) * w, (j // cols) * h))
    return grid
