"""Completion text -> Plans + a per-board parse status. Never raises, never hangs.

The answer is the text after the last `</think>` (when a think block was opened and never
closed, there is no answer). Then every line that names an agent is a plan line; everything else
is prose and ignored.

Tolerant of what models write: any case; bullets and numbering (`-`, `*`, `1.`), markdown
emphasis and code marks; `Agent 0 :`, `agent 0 -`; actions separated by spaces, commas,
semicolons or arrows (`->`, `→`, `=>`); a trailing period or a parenthesised remark;
`WAIT` for STAY. A repeated agent keeps its *last* line (models restate their final answer).

Strict about what changes meaning: any other word among the actions is BAD_ACTION, an agent the
board does not have is UNKNOWN_AGENT, an agent of the board without a line is MISSING_AGENT,
more actions than the horizon is TOO_LONG, and a completion that hit its token budget is
TRUNCATED. Statuses are checked in that order of severity: truncated, then no_answer,
bad_action, unknown_agent, too_long, missing_agent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from t2t_jax.env.io import plans_from_lists
from t2t_jax.env.types import ACTION_NAMES, ParseStatus, Plans

END_THINK, THINK = "</think>", "<think>"
SYNONYMS = {name: name for name in ACTION_NAMES} | {"WAIT": "STAY", "NOOP": "STAY"}
MAX_LINE = 4096  # longer lines are cut: nothing legitimate is this long

_PREFIX = re.compile(r"^[\s>*_`#\-•·+]*(?:\d{1,3}[.)]\s*)?[\s*_`]*")
_AGENT = re.compile(r"agent[\s*_`]*(\d{1,6})[\s*_`]*[:：\-–—=]+(.*)$", re.IGNORECASE)
_REMARKS = re.compile(r"\([^)]*\)|\[[^\]]*\]|\{[^}]*\}")
_SPLIT = re.compile(r"(?:->|=>|→|⟶|➔|[\s,;|/])+")


def answer_text(text: str) -> str | None:
    """The part after the last </think>; None if a think block is still open."""
    if END_THINK in text:
        return text.rsplit(END_THINK, 1)[1]
    if THINK in text:
        return None
    return text


def parse_completion(text: str, num_agents: int, horizon: int, truncated: bool = False) -> tuple[list, ParseStatus]:
    """One completion -> (per-agent action-name lists or None, status)."""
    try:
        return _parse(text, num_agents, horizon, truncated)
    except Exception:  # a last resort: the parser must never raise
        return [None] * num_agents, ParseStatus.NO_ANSWER


def _parse(text, num_agents, horizon, truncated):
    answer = answer_text(text if isinstance(text, str) else "")
    lines: dict[int, list[str]] = {}
    bad = unknown = too_long = False
    for raw in (answer or "").splitlines():
        line = _PREFIX.sub("", raw[:MAX_LINE], count=1)
        m = _AGENT.match(line)
        if not m:
            continue
        idx = int(m.group(1))
        words = [w.strip("*_`'\".:!").upper() for w in _SPLIT.split(_REMARKS.sub(" ", m.group(2)))]
        words = [w for w in words if w]
        actions = [SYNONYMS.get(w) for w in words]
        if any(a is None for a in actions):
            bad = True
            continue
        if idx >= num_agents:
            unknown = True
            continue
        too_long |= len(actions) > horizon
        lines[idx] = actions
    plan = [lines.get(i) for i in range(num_agents)]
    if truncated:
        status = ParseStatus.TRUNCATED
    elif answer is None or not (lines or bad or unknown):
        status = ParseStatus.NO_ANSWER
    elif bad:
        status = ParseStatus.BAD_ACTION
    elif unknown:
        status = ParseStatus.UNKNOWN_AGENT
    elif too_long:
        status = ParseStatus.TOO_LONG
    elif any(p is None for p in plan):
        status = ParseStatus.MISSING_AGENT
    else:
        status = ParseStatus.OK
    return plan, status


def parse_completions(
    texts: Sequence[str],
    num_agents: Sequence[int],
    max_agents: int,
    horizon: int,
    truncated: Sequence[bool] | None = None,
) -> Plans:
    """Completions -> Plans [B, max_agents, horizon] with `parse_status` and `unknown_agent`."""
    truncated = truncated if truncated is not None else [False] * len(texts)
    parsed = [parse_completion(t, k, horizon, bool(tr)) for t, k, tr in zip(texts, num_agents, truncated)]
    return plans_from_lists(
        [p for p, _ in parsed],
        max_agents,
        horizon,
        statuses=[int(s) for _, s in parsed],
        unknown=[s == ParseStatus.UNKNOWN_AGENT for _, s in parsed],
    )
