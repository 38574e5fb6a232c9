"""Pictures: sizes, colours where the agents and holes are, GIF frames, the CLI."""

import json
import subprocess
import sys

import pytest
from conftest import make_board
from PIL import Image

from t2t_jax.render import AGENT_COLOURS, board_image, boards_grid, plan_frames, plan_strip, save_gif
from t2t_jax.render.board import BAD, HOLE, ICE, LEGEND_ROW

BOARD = make_board(4, holes=[(1, 1)], starts=[(0, 0), (3, 3)], goals=[(3, 3), (0, 0)])


def centre(r, c, cell, top=0):
    return (c * cell + cell // 2, top + r * cell + cell // 2)


def test_board_image_colours():
    img = board_image(BOARD, cell=40)
    assert img.size == (160, 160 + 2 * LEGEND_ROW)
    assert img.getpixel(centre(1, 1, 40)) == HOLE
    assert img.getpixel((2 * 40 + 20, 2 * 40 + 20)) == ICE
    # Agent discs: sample beside the number drawn at the centre.
    x, y = centre(0, 0, 40)
    assert img.getpixel((x - 10, y)) == AGENT_COLOURS[0]
    x, y = centre(3, 3, 40)
    assert img.getpixel((x - 10, y)) == AGENT_COLOURS[1]


def test_plan_frames_mark_collisions():
    swap = make_board(3, starts=[(0, 0), (0, 1)], goals=[(0, 1), (0, 0)])
    frames = plan_frames(swap, [["RIGHT"], ["LEFT"]], cell=40)
    assert len(frames) == 2
    red = sum(1 for p in frames[1].getdata() if p == BAD)
    assert red > 50 and not any(p == BAD for p in frames[0].getdata())
    strip = plan_strip(swap, [["RIGHT"], ["LEFT"]], cell=40)
    assert strip.size[0] == 2 * frames[0].size[0] + 6


def test_gif_and_grid(tmp_path):
    path = tmp_path / "plan.gif"
    save_gif(
        BOARD,
        [["DOWN", "DOWN", "DOWN", "RIGHT", "RIGHT", "RIGHT"], ["UP", "UP", "UP", "LEFT", "LEFT", "LEFT"]],
        str(path),
    )
    gif = Image.open(path)
    assert gif.n_frames == 7
    grid = boards_grid([BOARD, make_board(6, starts=[(0, 0)], goals=[(5, 5)])], cols=2, cell=20)
    assert grid.size[0] == 2 * (6 * 20 + 8)


def test_render_cli(tmp_path):
    boards = tmp_path / "boards.jsonl"
    boards.write_text(json.dumps(BOARD | {"plan": "Agent 0: DOWN\nAgent 1: UP"}) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "launch.mapf", "render", f"--boards={boards}", f"--out={tmp_path / 'pics'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in (tmp_path / "pics").iterdir())
    assert names == ["board_0.png", "grid.png", "plan_0.gif"]


def test_forest_plot_marks_significance_and_places_rows_on_a_shared_axis():
    from t2t_jax.render.forest import OTHER, SIGNIFICANT, ZERO, forest_plot

    panels = [
        ("vs warm start", [("grpo", 0.04, 0.02, 0.06, 0.0002), ("shuffle", -0.01, -0.03, 0.01, 0.4)]),
        ("vs grpo", [("shuffle", -0.05, -0.07, -0.03, 0.0001)]),
        ("third", [("x", 0.0, -0.01, 0.01, 0.9)]),
    ]
    img = forest_plot(panels, title="t", columns=2)
    colours = {c for _, c in img.getcolors(1 << 20)}
    assert SIGNIFICANT in colours and OTHER in colours and ZERO in colours
    one_line = forest_plot(panels, columns=3)
    assert one_line.width > img.width and one_line.height < img.height  # 3 panels on one line vs 2 + 1

    def dot_x(image, colour, y_band):
        xs = [x for x in range(image.width) for y in y_band if image.getpixel((x, y)) == colour]
        return sum(xs) / len(xs)

    # The first panel's first row (+4 points) lies right of the zero line, the second row's left of it.
    single = forest_plot(panels[:1], columns=1)
    zero = [x for x in range(single.width) if single.getpixel((x, single.height // 2)) == ZERO]
    assert zero and dot_x(single, SIGNIFICANT, range(45, 70)) > zero[0]
    with pytest.raises(ValueError, match="no rows"):
        forest_plot([("empty", [])])
