"""Pictures of boards and executed plans (PIL): see board.py."""

from t2t_jax.render.board import AGENT_COLOURS, board_image, boards_grid, plan_frames, plan_strip, save_gif

__all__ = ["AGENT_COLOURS", "board_image", "boards_grid", "plan_frames", "plan_strip", "save_gif"]
