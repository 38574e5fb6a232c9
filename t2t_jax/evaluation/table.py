"""The paper's table from any results files: runs, HF checkpoints and API models (what
`launch.eval` and `launch.main` write) beside the paper's own rows, with 95% intervals per cell and
on Sum, and paired tests on Sum between rows scored on the same boards (`python -m launch.table`).

    rows = [load_row("eval_base", "base"), load_row("runs/ours/results.json#stage_3", "ours")]
    table = build(rows, paired="all")         # {"tables", "paired", "rows", "notes", "source"}
    paths = write(out_dir, table)             # table.{md,csv,json,png}

A cell is the share of a map size's boards with a valid (acc.) or optimal (opt.) plan, with its
95% Wilson interval. Sum is the mean over the table's sizes, as the paper's; its interval is a
bootstrap over boards within each cell (`sum_interval`: a cell's resampled count is binomial, so
the draws need counts only). The paper's rows carry their published figures; their intervals
assume 150 boards per cell (this codebase's sets; the paper does not state its count). Two rows
on the same boards (one digest, or before digests the same cells) compare on Sum per agents
table: with equal boards per cell the mean over boards is Sum, so the exact McNemar test on the
boards that changed (`benchmark.paired_change`) is the exact sign-flip test of the Sum difference.
"""

from __future__ import annotations

import csv
import dataclasses
import io as _io
import itertools
import json
import os

import numpy as np

from t2t_jax import storage
from t2t_jax.engineer.context import wilson
from t2t_jax.env import io
from t2t_jax.errors import UserError
from t2t_jax.evaluation import benchmark
from t2t_jax.evaluation.decoding import describe

PAPER_BOARDS = 150  # boards per cell assumed for the paper's rows (the shipped sets' count)
MAX_BYTES = 256 << 20  # a results file larger than this is refused
METRICS = {"acc": "valid", "opt": "optimal"}


@dataclasses.dataclass(frozen=True)
class Row:
    """One model's results: counts per (agents, size) cell and, for paired tests, one '0'/'1' per
    board in benchmark order (cells contiguous, sorted by agents then size)."""

    label: str
    source: str  # the file it was read from, or the paper
    cells: dict  # (agents, size) -> (boards, valid, optimal) counts
    board_valid: str = ""
    board_optimal: str = ""
    digest: str = ""  # benchmark.boards_digest ("" in files written before it)
    decoding: dict | None = None  # decoding.record ("paper": None)
    paper: bool = False


def read_json(path: str):
    """A JSON file, bounded; UserError (one line, naming the file) when it is missing, too large,
    not UTF-8 or not JSON."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise UserError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        return io.loads_bounded(raw.decode("utf-8"), path)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start + 1})") from None
    except ValueError as e:
        raise UserError(str(e)) from None


def _entry(path: str) -> tuple[dict, str, str]:
    """(the results entry, its default label, the file read) of PATH[#POINT]: a results_table.json, a results.json
    (its last point, or POINT) or a directory holding either (results_table.json first)."""
    path, _, point = path.partition("#")
    if os.path.isdir(path):
        for name in ("results_table.json", "results.json"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise UserError(f"{path}: holds neither results_table.json nor results.json")
    data = read_json(path)
    if isinstance(data, list):  # a run's results.json: its points
        points = [p for p in data if isinstance(p, dict)]
        chosen = [p for p in points if p.get("point") == point] if point else points[-1:]
        if not chosen:
            known = [p.get("point") for p in points]
            raise UserError(f"{path}: no point {point!r} (points: {known})" if point else f"{path}: no points")
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
        return chosen[-1], f"{name}:{chosen[-1].get('point')}", path
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a results file (a JSON object or a list of points)")
    if point:
        raise UserError(f"{path}#{point}: a point is chosen only in a run's results.json")
    label = data.get("label") or data.get("point") or os.path.basename(os.path.dirname(os.path.abspath(path)))
    return data, label, path


def _count(cell: dict, key: str, where: str) -> int:
    rate, n = cell.get(key), cell.get("boards")
    count_ok = isinstance(n, int) and not isinstance(n, bool) and n >= 1
    if not count_ok or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise UserError(f"{where}: {key} {rate!r} of {n!r} boards is not a rate of a board count")
    return int(round(rate * n))


def load_row(path: str, label: str = "") -> Row:
    """A results file (see `_entry` for PATH[#POINT]) -> Row; UserError names the file and what
    is wrong with it."""
    entry, default, where = _entry(path)
    cells = entry.get("cells")
    if not isinstance(cells, list) or not cells:
        raise UserError(
            f"{where}: no per-cell board counts (a results_table.json written before launch.table; "
            "give the run's results.json or rerun launch.eval)"
        )
    counts = {}
    for c in cells:
        if not isinstance(c, dict) or not all(isinstance(c.get(k), int) for k in ("agents", "size")):
            raise UserError(f"{where}: cells: {str(c)[:80]} has no integer agents and size")
        counts[(c["agents"], c["size"])] = (c["boards"], _count(c, "valid", where), _count(c, "optimal", where))
    if sorted(counts) != [(c["agents"], c["size"]) for c in cells]:
        raise UserError(f"{where}: cells are not sorted by agents then size, once each (not benchmark order)")
    boards = sum(n for n, _, _ in counts.values())
    flags = {}
    for key in ("board_valid", "board_optimal"):
        value = entry.get(key) or ""
        if value and (not isinstance(value, str) or len(value) != boards or set(value) - {"0", "1"}):
            raise UserError(f"{where}: {key} is not one '0'/'1' per board of its {boards} boards")
        flags[key] = value
    decoding = entry.get("decoding") if isinstance(entry.get("decoding"), dict) else None
    digest = entry.get("boards_digest") if isinstance(entry.get("boards_digest"), str) else ""
    return Row(label or default, where, counts, flags["board_valid"], flags["board_optimal"], digest, decoding)


def paper_rows() -> list[Row]:
    """The paper's rows (t2t_jax/evaluation/data/paper_table.json), counts at `PAPER_BOARDS` per cell."""
    rows: dict = {}
    for key, models in benchmark.paper_table()["tables"].items():
        agents = int(key.split("_")[0])
        for model, cells in models.items():
            for size, v in cells.items():
                if size != "sum":
                    n = PAPER_BOARDS
                    count = (n, round(v["acc"] * n / 100), round(v["opt"] * n / 100))
                    rows.setdefault(model, {})[(agents, int(size))] = count
    return [Row(f"{m} [paper]", "paper", c, paper=True) for m, c in rows.items()]


def sum_interval(counts, boards, resamples: int = 10000, seed: int = 0) -> list[float]:
    """The 95% percentile interval of Sum (the mean over cells of count / boards), resampling
    boards within each cell: counts, boards [S] -> [low, high] as fractions."""
    counts, boards = np.asarray(counts), np.asarray(boards)
    draws = np.random.default_rng(seed).binomial(boards, counts / boards, size=(resamples, len(boards)))
    low, high = np.percentile((draws / boards).mean(axis=1), [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def _table(row: Row, agents: int, published: dict | None, resamples: int, seed: int) -> dict:
    """One row of one agents table: {size: {n, acc, acc_ci, opt, opt_ci} (in %), "sum": ...};
    `published` (the paper's figures of the row's table, by size and "sum") replaces the rates
    derived from the counts, not the intervals."""
    out, sizes = {}, sorted(n for a, n in row.cells if a == agents)
    for size in sizes:
        n, *hits = row.cells[(agents, size)]
        cell = {"n": n}
        for m, k in zip(METRICS, hits):
            rate = published[str(size)][m] if published else round(100 * k / n, 2)
            cell[m], cell[f"{m}_ci"] = rate, [round(100 * x, 2) for x in wilson(k, n)]
        out[str(size)] = cell
    if sizes:
        n = [row.cells[(agents, s)][0] for s in sizes]
        total = {"n": int(sum(n))}
        for i, m in enumerate(METRICS, start=1):
            hits = [row.cells[(agents, s)][i] for s in sizes]
            mean = published["sum"][m] if published else round(100 * float(np.mean(np.divide(hits, n))), 2)
            total[m], total[f"{m}_ci"] = mean, [round(100 * x, 2) for x in sum_interval(hits, n, resamples, seed)]
        out["sum"] = total
    return out


def _offsets(row: Row, agents: int) -> tuple[int, int]:
    """[start, end) of the agents table's boards in the row's board order."""
    start = sum(n for (a, _), (n, _, _) in row.cells.items() if a < agents)
    return start, start + sum(n for (a, _), (n, _, _) in row.cells.items() if a == agents)


def same_boards(a: Row, b: Row) -> str | None:
    """Why rows `a` and `b` cannot be compared board by board (None: they can)."""
    if a.paper or b.paper:
        return f"{(a if a.paper else b).label} is a published row (no per-board results)"
    if not a.board_valid or not b.board_valid:
        return f"{(a if not a.board_valid else b).label} has no per-board results (board_valid)"
    if a.digest and b.digest and a.digest != b.digest:
        return f"{a.label} and {b.label} were scored on different boards (digests {a.digest}, {b.digest})"
    if {k: v[0] for k, v in a.cells.items()} != {k: v[0] for k, v in b.cells.items()}:
        per = {r.label: sorted({v[0] for v in r.cells.values()}) for r in (a, b)}
        return f"{a.label} and {b.label} were scored on different boards (boards per cell: {per}); use one --per_cell"
    if len({v[0] for v in a.cells.values()}) != 1:
        return f"{a.label}: unequal boards per cell, so the mean over boards is not Sum"
    return None


def paired(a: Row, b: Row) -> list[dict]:
    """Paired tests of b against a on Sum, per agents table and metric (opt. where both rows
    have board_optimal): `benchmark.paired_change` on the table's boards ("diff" and "ci95" in
    points); ValueError when the rows are not on the same boards (`same_boards`)."""
    problem = same_boards(a, b)
    if problem:
        raise ValueError(problem)
    out = []
    for agents in sorted({k for k, _ in a.cells}):
        lo, hi = _offsets(a, agents)
        for m, key in METRICS.items():
            x, y = getattr(a, f"board_{key}")[lo:hi], getattr(b, f"board_{key}")[lo:hi]
            if not x or not y:
                continue
            test = benchmark.paired_change({"point": a.label, "board_valid": x}, {"point": b.label, "board_valid": y})
            out.append(
                {
                    "table": f"{agents}_agents",
                    "metric": m,
                    "a": a.label,
                    "b": b.label,
                    "diff": round(100 * test["diff"], 2),
                    "ci95": [round(100 * v, 2) for v in test["ci95"]],
                    "gained": test["gained"],
                    "lost": test["lost"],
                    "p_value": test["p_value"],
                    "boards": hi - lo,
                }
            )
    return out


def build(rows, paper: bool = True, pairs="all", resamples: int = 10000, seed: int = 0) -> dict:
    """Rows (`load_row`) -> the merged tables. pairs: "all" (every two rows on the same boards; the
    others listed in "notes"), "none", or a list of (label a, label b) whose tests must exist
    (ValueError otherwise). Returns {"source", "paper", "rows", "tables": {"3_agents": {label: {size: cell,
    "sum": ...}}}, "paired": [...], "notes": [...]}; figures in % (intervals too)."""
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two rows are labelled {next(x for x in labels if labels.count(x) > 1)!r}; give LABEL=PATH")
    published = benchmark.paper_table()
    every = ([*paper_rows()] if paper else []) + list(rows)
    tables = {}
    for agents in benchmark.AGENT_SETS:
        name = f"{agents}_agents"
        tables[name] = {}
        for row in every:
            figures = published["tables"].get(name, {}).get(row.label.removesuffix(" [paper]"))
            cells = _table(row, agents, figures if row.paper else None, resamples, seed)
            if cells:
                tables[name][row.label] = cells
    tests, notes = [], []
    if pairs == "all":
        for a, b in itertools.combinations(rows, 2):
            problem = same_boards(a, b)
            if problem:
                notes.append(f"no paired test of {a.label} and {b.label}: {problem}")
            else:
                tests += paired(a, b)
    elif pairs != "none":
        by = {r.label: r for r in rows}
        for a, b in pairs:
            for x in (a, b):
                if x not in by:
                    raise ValueError(f"--paired: no row labelled {x!r} (rows: {labels})")
            tests += paired(by[a], by[b])
    return {
        "source": published["source"],
        "paper": paper,
        "rows": [
            {
                "label": r.label,
                "source": r.source,
                "decoding": r.decoding,
                "boards": int(sum(v[0] for v in r.cells.values())),
                "boards_digest": r.digest,
            }
            for r in rows
        ],
        "tables": tables,
        "paired": tests,
        "notes": notes,
    }


def _fmt(cell: dict | None, m: str) -> str:
    if cell is None:
        return "–"
    lo, hi = cell[f"{m}_ci"]
    return f"{cell[m]:.2f} ({lo:.1f}–{hi:.1f})"


def _p(p: float) -> str:
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def markdown(table: dict) -> str:
    """The merged tables as Markdown: the paper's layout with intervals, then the paired tests,
    the rows' sources and decodings, and the notes."""
    md = ["# MAPF-FrozenLake: the paper's table, merged", ""]
    md.append(
        "acc. = valid %, opt. = optimal %, (95% interval): Wilson per cell, a bootstrap over boards "
        "within cells on Sum (the mean over sizes)."
        + (
            f" Rows marked [paper] are the published figures ({table['source']}); their intervals assume "
            f"{PAPER_BOARDS} boards per cell."
            if table["paper"]
            else ""
        )
    )
    for key, models in table["tables"].items():
        sizes = sorted({s for m in models.values() for s in m if s != "sum"}, key=int)
        md += ["", f"### {key.replace('_', ' ')}", "", *benchmark.table_header(sizes)]
        for model, cells in models.items():
            vals = [cells.get(s) for s in [*sizes, "sum"]]
            md.append(f"| {model} | " + " | ".join(f"{_fmt(v, 'acc')} | {_fmt(v, 'opt')}" for v in vals) + " |")
    if table["paired"]:
        md += ["", "### Paired tests on Sum (same boards; exact McNemar = exact sign-flip over boards)", ""]
        md += ["| table | metric | A | B | B − A (points) | 95% CI | gained | lost | p |", "|---" * 9 + "|"]
        for t in table["paired"]:
            lo, hi = t["ci95"]
            md.append(
                f"| {t['table'].replace('_', ' ')} | {t['metric']}. | {t['a']} | {t['b']} | {t['diff']:+.2f} | "
                f"{lo:+.2f}, {hi:+.2f} | {t['gained']} | {t['lost']} | {_p(t['p_value'])} |"
            )
    md += ["", "### Rows", "", "| row | source | boards | decoding |", "|---|---|---|---|"]
    for r in table["rows"]:
        md.append(f"| {r['label']} | {r['source']} | {r['boards']} | {describe(r['decoding'])} |")
    md += [f"\n- {n}" for n in table["notes"]]
    return "\n".join(md) + "\n"


def csv_text(table: dict) -> str:
    """One line per (table, row, size or sum): counts' rates and intervals in %."""
    buf = _io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["agents", "model", "paper", "size", "n", "acc", "acc_lo", "acc_hi", "opt", "opt_lo", "opt_hi"])
    for key, models in table["tables"].items():
        for model, cells in models.items():
            for size, c in cells.items():
                writer.writerow(
                    [key.split("_")[0], model, model.endswith(" [paper]"), size, c["n"]]
                    + [x for m in METRICS for x in (c[m], *c[f"{m}_ci"])]
                )
    return buf.getvalue()


def figure(table: dict):
    """acc. and opt. over map size for every row (ours with 95% Wilson whiskers, the paper's pale),
    one panel per agents table and metric (`render.curves.rate_curves`) -> an RGB image."""
    from t2t_jax.render.curves import rate_curves

    panels = []
    for key, models in table["tables"].items():
        for m in METRICS:
            series = []
            for label, cells in models.items():
                sizes = sorted((s for s in cells if s != "sum"), key=int)
                ci = [cells[s][f"{m}_ci"] for s in sizes]
                rates = [cells[s][m] for s in sizes]
                paper = label.endswith(" [paper]")
                series.append((label, [int(s) for s in sizes], rates, [c[0] for c in ci], [c[1] for c in ci], paper))
            if series:
                panels.append((f"{key.replace('_', ' ')}: {m}. (%)", series))
    return rate_curves(panels, title="The paper's table, merged (whiskers: 95% Wilson intervals)")


def write(directory: str, table: dict) -> dict:
    """table.{md,csv,json,png} under `directory` (made if absent). Returns {ext: path}."""
    storage.makedirs(directory)
    paths = {ext: storage.join(directory, f"table.{ext}") for ext in ("md", "csv", "json", "png")}
    io.write_atomic(paths["md"], markdown(table))
    io.write_atomic(paths["csv"], csv_text(table))
    io.write_atomic(paths["json"], json.dumps(table, indent=1))
    io.write_png(paths["png"], figure(table))
    return paths
