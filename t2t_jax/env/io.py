"""Board and plan interchange: JSON lines for boards, the `Agent i: ...` text form for plans.

A board is `{"size": N, "holes": [[r, c], ...], "starts": [[r, c], ...], "goals": [[r, c], ...]}`,
optionally with "bucket", "lower_bound", "optimal_makespan" (and, later, "plan"). Files hold one
JSON object per line. A plan is one line per agent, `Agent 0: LEFT DOWN LEFT` (an agent that
stays put may have an empty line, `Agent 1:`); reading plan text is t2t_jax.text.parsing's job.
"""

from __future__ import annotations

import io as _io
import json
import re
from collections.abc import Iterable, Sequence

import numpy as np

from t2t_jax import storage
from t2t_jax.env.config import MIN_SIZE
from t2t_jax.env.types import ACTION_NAMES, UNKNOWN, Boards, ParseStatus, Plans

ACTION_CODES = {name: code for code, name in enumerate(ACTION_NAMES)}


def board_to_json(boards: Boards, i: int) -> dict:
    """Board `i` of a batch as an interchange dict (padding dropped)."""
    n = int(boards.size[i])
    k = int(np.asarray(boards.agent_mask[i]).sum())
    holes = np.argwhere(np.asarray(boards.holes[i])[:n, :n])
    out = {
        "size": n,
        "holes": holes.tolist(),
        "starts": np.asarray(boards.starts[i])[:k].tolist(),
        "goals": np.asarray(boards.goals[i])[:k].tolist(),
        "bucket": int(boards.bucket[i]),
    }
    for name in ("lower_bound", "optimal_makespan"):
        value = int(getattr(boards, name)[i])
        if value != UNKNOWN:
            out[name] = value
    return out


def boards_to_json(boards: Boards) -> list[dict]:
    return [board_to_json(boards, i) for i in range(boards.size.shape[0])]


def boards_with_plans_to_json(boards: Boards, plans: Plans) -> list[dict]:
    """Board dicts, each with its plan (e.g. the certified witness) as text under "plan"."""
    items = boards_to_json(boards)
    actions, lengths = np.asarray(plans.actions), np.asarray(plans.lengths)
    for i, item in enumerate(items):
        k = len(item["starts"])
        item["plan"] = plan_to_text([a[:n] for a, n in zip(actions[i, :k], lengths[i, :k])])
    return items


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # (JSON true is no size)


INT32_MAX = 2**31 - 1  # every number of a board is stored as int32
MAX_DEPTH = 32  # JSON nesting a board or plan line may have (a board needs 3)
MAX_LINE_BYTES = 1 << 24  # the longest line of a board or plan file (16 MiB: a plan of a million actions fits)
MAX_DIGITS = 30  # longer integer literals are read as a BigNumber (never converted)


class BigNumber(str):
    """An integer literal of more than MAX_DIGITS digits, kept as its text: no field accepts it."""

    def __repr__(self) -> str:
        return f"{self[:12]}...({len(self.lstrip('-'))} digits)"


def _int_field(value, where: str, lo: int, hi: int) -> int:
    """`value` as an integer in [lo, hi]; ValueError names `where` and the legal range."""
    if isinstance(value, BigNumber):
        raise ValueError(f"{where}: {value!r} is outside the legal range [{lo}, {hi}]")
    if not _is_int(value):
        raise ValueError(f"{where}: {value!r} is not an integer in [{lo}, {hi}]")
    if not lo <= value <= hi:
        raise ValueError(f"{where}: {value} is outside the legal range [{lo}, {hi}]")
    return value


def _cells(value, where: str, n: int) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of [row, col] pairs")
    out = []
    for j, cell in enumerate(value):
        if not isinstance(cell, (list, tuple)) or len(cell) != 2 or not all(_is_int(v) for v in cell):
            raise ValueError(f"{where}[{j}]: expected [row, col] integers, got {cell!r}")
        if not all(0 <= v < n for v in cell):
            raise ValueError(f"{where}[{j}]: {list(cell)} is outside the {n}x{n} grid")
        out.append(tuple(cell))
    return out


def boards_from_json(
    items: Sequence[dict], max_size: int = 10, max_agents: int = 5, names: Sequence[str] | None = None
) -> Boards:
    """Interchange dicts -> a padded Boards batch; ValueError names the board (`names[i]`, default
    `board i`) and the field. Types are exact: sizes and cells are JSON integers, not strings
    or booleans."""
    b = len(items)
    size = np.zeros(b, np.int32)
    holes = np.zeros((b, max_size, max_size), bool)
    starts = np.zeros((b, max_agents, 2), np.int32)
    goals = np.zeros((b, max_agents, 2), np.int32)
    mask = np.zeros((b, max_agents), bool)
    extra = {name: np.full(b, UNKNOWN, np.int32) for name in ("lower_bound", "optimal_makespan")}
    bucket = np.zeros(b, np.int32)
    for i, item in enumerate(items):
        where = names[i] if names is not None else f"board {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: a board is a JSON object, got {type(item).__name__}")
        n = item.get("size")
        if not _is_int(n) and not isinstance(n, BigNumber):
            raise ValueError(f"{where}: size: {n!r} is not an integer")
        n = _int_field(n, f"{where}: size", MIN_SIZE, max_size)
        hs = _cells(item.get("holes", []), f"{where}: holes", n)
        ss = _cells(item.get("starts"), f"{where}: starts", n)
        gs = _cells(item.get("goals"), f"{where}: goals", n)
        if len(ss) != len(gs) or not 1 <= len(ss) <= max_agents:
            raise ValueError(
                f"{where}: {len(ss)} starts and {len(gs)} goals; need the same number, within [1, {max_agents}]"
            )
        if len(set(ss)) < len(ss) or len(set(gs)) < len(gs):
            raise ValueError(f"{where}: starts and goals must each be distinct cells")
        if set(hs) & (set(ss) | set(gs)):
            raise ValueError(f"{where}: a start or goal lies on a hole")
        size[i] = n
        for r, c in hs:
            holes[i, r, c] = True
        starts[i, : len(ss)] = ss
        goals[i, : len(gs)] = gs
        mask[i, : len(ss)] = True
        for name in ("bucket", *extra):
            if item.get(name) is not None:
                _int_field(item[name], f"{where}: {name}", 0, INT32_MAX)
        if item.get("plan") is not None and not isinstance(item["plan"], str):
            raise ValueError(f"{where}: plan: {item['plan']!r} is not a string (the plan text)")
        bucket[i] = item.get("bucket") or 0
        for name in extra:
            if item.get(name) is not None:
                extra[name][i] = item[name]
    return Boards(size=size, holes=holes, starts=starts, goals=goals, agent_mask=mask, bucket=bucket, **extra)


def board_text(board: dict) -> str:
    """The text form: N rows of `.` (frozen) and `H` (hole), then one line per agent."""
    n = board["size"]
    grid = [["."] * n for _ in range(n)]
    for r, c in board["holes"]:
        grid[r][c] = "H"
    lines = ["".join(row) for row in grid]
    for i, (s, g) in enumerate(zip(board["starts"], board["goals"])):
        lines.append(f"Agent {i}: start ({s[0]}, {s[1]}), goal ({g[0]}, {g[1]})")
    return "\n".join(lines)


def plan_to_text(actions: Sequence[Sequence[int | str]]) -> str:
    """Per-agent action lists (codes or names) -> `Agent i: A B C` lines."""

    def name(a):
        return a if isinstance(a, str) else ACTION_NAMES[int(a)]

    return "\n".join(f"Agent {i}:" + "".join(" " + name(a) for a in acts) for i, acts in enumerate(actions))


def plans_from_lists(
    plans: Sequence[Sequence],
    max_agents: int,
    horizon: int,
    statuses: Iterable[int] | None = None,
    unknown: Iterable[bool] | None = None,
) -> Plans:
    """Per-board lists of per-agent action lists (names or codes, None = no line) -> Plans.

    Plans longer than `horizon` are cut there and get ParseStatus.TOO_LONG.
    """
    b = len(plans)
    actions = np.zeros((b, max_agents, horizon), np.int8)
    lengths = np.zeros((b, max_agents), np.int32)
    present = np.zeros((b, max_agents), bool)
    status = np.array(list(statuses) if statuses is not None else [0] * b, np.int32)
    extra = np.array(list(unknown) if unknown is not None else [False] * b, bool)
    for i, plan in enumerate(plans):
        for j, acts in enumerate(plan):
            if acts is None:
                continue
            if j >= max_agents:
                extra[i] = True
                continue
            codes = [ACTION_CODES[a] if isinstance(a, str) else int(a) for a in acts]
            if len(codes) > horizon:
                if status[i] == ParseStatus.OK:
                    status[i] = ParseStatus.TOO_LONG
                codes = codes[:horizon]
            actions[i, j, : len(codes)] = codes
            lengths[i, j] = len(acts)
            present[i, j] = True
    return Plans(actions=actions, lengths=lengths, present=present, parse_status=status, unknown_agent=extra)


def verdict_to_json(verdicts, i: int) -> dict:
    """Verdict `i` of a batch as a JSON-ready dict (goal_reached cut to the board's agents by
    the caller if wanted)."""
    out = {}
    for name, value in verdicts.items():
        v = np.asarray(value[i])
        out[name] = v.tolist() if v.ndim else (bool(v) if v.dtype == bool else int(v))
    return out


class _NotJson(ValueError):
    pass


def _constant(name: str):
    raise _NotJson(f"{name} is not JSON (numbers are finite)")


def _depth(line: str) -> int:
    """How deep the brackets of a JSON line nest (outside strings)."""
    depth = deepest = 0
    for token in _BRACKETS.findall(_STRINGS.sub('""', line)):
        depth += 1 if token in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def loads_bounded(text: str, where: str):
    """`json.loads(text)`, bounded: nesting at most MAX_DEPTH deep, integer literals of at most
    MAX_DIGITS digits (longer ones are a `BigNumber`, refused by every field), no NaN or
    Infinity. ValueError names `where`."""
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise ValueError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text,
            parse_int=lambda s: int(s) if len(s) <= MAX_DIGITS else BigNumber(s),
            parse_constant=_constant,
        )
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    except _NotJson as e:
        raise ValueError(f"{where}: {e}") from None
    except RecursionError:  # (unreachable below MAX_DEPTH; kept as a guard)
        raise ValueError(f"{where}: JSON nested too deep") from None


def read_jsonl_numbered(path: str) -> list[tuple[str, dict]]:
    """(`path:LINE`, object) for each non-blank line of a JSON-lines file; ValueError names
    `path:LINE` for a line that is not one JSON object (`loads_bounded`), is not UTF-8 or is
    longer than MAX_LINE_BYTES."""
    out = []
    with open(path, "rb") as f:
        number = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            number += 1
            where = f"{path}:{number}"
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise ValueError(f"{where}: a line longer than {MAX_LINE_BYTES} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 text (byte {e.start + 1} of the line)") from None
            if not line.strip():
                continue
            item = loads_bounded(line, where)
            if not isinstance(item, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
            out.append((where, item))
    return out


def read_jsonl(path: str) -> list[dict]:
    """The objects of a JSON-lines file (see read_jsonl_numbered)."""
    return [item for _, item in read_jsonl_numbered(path)]


def read_boards(path: str, max_size: int = 10, max_agents: int = 5) -> tuple[list[dict], Boards]:
    """A boards file, every board checked (errors name `path:LINE: field`): (dicts, Boards)."""
    numbered = read_jsonl_numbered(path)
    if not numbered:
        raise ValueError(f"{path}: holds no boards (one JSON object per line)")
    items = [item for _, item in numbered]
    return items, boards_from_json(items, max_size, max_agents, names=[w for w, _ in numbered])


def read_plans(path: str) -> list[dict]:
    """A plans file: objects with a string "text" and an optional boolean "truncated"."""
    numbered = read_jsonl_numbered(path)
    for where, item in numbered:
        if not isinstance(item.get("text", ""), str):
            raise ValueError(f"{where}: text: {item['text']!r} is not a string")
        if not isinstance(item.get("truncated", False), bool):
            raise ValueError(f"{where}: truncated: {item['truncated']!r} is not true or false")
    return [item for _, item in numbered]


def write_atomic(path: str, data: str | bytes | Iterable[str]) -> None:
    """Write `data` (text, bytes, or text chunks, streamed) so that nothing half-written is left:
    locally a temporary file beside `path`, then a rename; on gs:// one object put
    (t2t_jax/storage.py)."""
    storage.write_atomic(path, data)


def write_png(path: str, image) -> None:
    """A PIL image as a PNG file, written atomically (`write_atomic`)."""
    buf = _io.BytesIO()
    image.save(buf, format="PNG")
    write_atomic(path, buf.getvalue())


def write_jsonl(path: str, items: Iterable[dict], sort_keys: bool = False) -> None:
    """All lines as one atomic write (see write_atomic)."""
    write_atomic(path, (json.dumps(item, sort_keys=sort_keys) + "\n" for item in items))
