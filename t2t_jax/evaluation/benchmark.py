"""The paper's results table: evaluate a policy on the benchmark sets, tabulate acc./opt. per
map size for 3, 4 and 5 agents (Sum = the mean over sizes), beside the paper's reported rows.

    boards = benchmark_boards(per_cell=None)                  # all 150 per cell, or a subset
    rollouts = evaluate(policy, params, boards, max_new_tokens=512, batch_size=64)
    entry = results_entry("final", rollouts)                  # {"point", "valid", "optimal", "cells"}
    write_tables(workdir, entry)                              # results_table.{md,csv,json}, heatmap.png

Decoding is greedy (temperature 0), one completion per board, in fixed-size batches (the last
one padded by repetition), so a run compiles one decode shape per prompt-length bucket.
"""
from __future__ import annotations

import csv
import io as _io
import json
import os

import numpy as np
from tqdm import tqdm

from t2t_jax.env import io
from t2t_jax.evaluation import sets
from t2t_jax.rl.rollout import concat

PAPER_TABLE = os.path.join(os.path.dirname(__file__), "data", "paper_table.json")
AGENT_SETS = {3: "mapf_3_agents", 4: "mapf_4_agents", 5: "mapf_5_agents"}


def paper_table() -> dict:
    """The paper's reported figures: tables["3_agents"][model][size or "sum"] = {acc, opt} in %."""
    with open(PAPER_TABLE) as f:
        return json.load(f)


def benchmark_boards(per_cell: int | None = None) -> list[dict]:
    """The benchmark sets' boards in file order; `per_cell` keeps the first that many of each
    (agents, size) cell (a fixed subset: the same boards every time)."""
    out = []
    for name in sets.BENCHMARK:
        counts: dict = {}
        for b in sets.load(name):
            key = (len(b["starts"]), b["size"])
            counts[key] = counts.get(key, 0) + 1
            if per_cell is None or counts[key] <= per_cell:
                out.append(b)
    return out


def evaluate(policy, params, boards, *, max_new_tokens: int, batch_size: int, reward_weights: dict,
             progress: bool = False, desc: str = "eval"):
    """Greedy rollouts of every board -> Rollouts in board order."""
    parts = []
    for start in tqdm(range(0, len(boards), batch_size), desc=desc, disable=not progress):
        chunk = list(boards[start:start + batch_size])
        real = len(chunk)
        chunk += [chunk[-1]] * (batch_size - real)
        out = policy.rollout(params, chunk, n=1, max_new_tokens=max_new_tokens, temperature=0.0,
                             reward_weights=reward_weights)
        parts.append(out.select(range(real)))
    return concat(parts)


def results_entry(point: str, rollouts) -> dict:
    """One evaluation point: overall `valid` / `optimal` fractions, per (agents, size) cells, and
    `board_valid`, one '0'/'1' per board in board order (for paired comparisons)."""
    keys = np.array([(len(b["starts"]), b["size"]) for b in rollouts.boards])
    valid, optimal = np.asarray(rollouts.verdicts.valid), np.asarray(rollouts.verdicts.optimal)
    cells = []
    for k, n in sorted({tuple(x) for x in keys.tolist()}):
        rows = np.flatnonzero((keys[:, 0] == k) & (keys[:, 1] == n))
        cells.append({"agents": int(k), "size": int(n), "boards": int(len(rows)),
                      "valid": float(valid[rows].mean()), "optimal": float(optimal[rows].mean()),
                      "mean_tokens": float(np.mean(rollouts.lengths[rows]))})
    return {"point": point, "boards": len(rollouts.boards), "valid": float(valid.mean()),
            "optimal": float(optimal.mean()), "mean_tokens": float(np.mean(rollouts.lengths)),
            "cells": cells, "board_valid": "".join("1" if v else "0" for v in valid)}


def paired_change(before: dict, after: dict) -> dict:
    """Two entries on the same boards -> {"against": before's point, "gained": boards valid only
    after, "lost": boards valid only before, "p_value": the exact two-sided McNemar test of
    gained against lost (a binomial test on the boards that changed; 1 when none did)}: the
    paired view of a change in the valid rate, and how likely a change that large is from churn
    alone."""
    from scipy.stats import binomtest
    a, b = before["board_valid"], after["board_valid"]
    if len(a) != len(b):
        raise ValueError(f"paired_change: {before['point']} has {len(a)} boards, {after['point']} {len(b)}")
    gained, lost = sum(x < y for x, y in zip(a, b)), sum(x > y for x, y in zip(a, b))
    p = binomtest(gained, gained + lost).pvalue if gained + lost else 1.0
    return {"against": before["point"], "gained": gained, "lost": lost, "p_value": round(float(p), 4)}


def table_rows(entry: dict, label: str = "ours") -> dict:
    """entry -> {"3_agents": {model: {size: {acc, opt, tokens?}, "sum": ...}}} with the paper's
    rows first and ours (in %) last; Sum is the mean over the sizes present."""
    paper = paper_table()["tables"]
    out = {}
    for k in AGENT_SETS:
        ours = {str(c["size"]): {"acc": round(100 * c["valid"], 2), "opt": round(100 * c["optimal"], 2),
                                 "tokens": round(c["mean_tokens"], 1)}
                for c in entry["cells"] if c["agents"] == k}
        if ours:
            ours["sum"] = {m: round(float(np.mean([v[m] for v in ours.values()])), 2) for m in ("acc", "opt", "tokens")}
        out[f"{k}_agents"] = {**paper.get(f"{k}_agents", {}), label: ours}
    return out


def write_tables(directory: str, entry: dict, label: str = "ours", prefix: str = "results_table") -> dict:
    """Markdown, CSV and JSON tables (and `heatmap.png`) of one evaluation point. Returns paths."""
    from t2t_jax.render.heatmap import rate_heatmap
    os.makedirs(directory, exist_ok=True)
    rows = table_rows(entry, label)
    md, buf = [], _io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["agents", "model", "size", "acc", "opt", "tokens"])
    for key, models in rows.items():
        sizes = sorted({s for m in models.values() for s in m if s != "sum"}, key=int)
        md.append(f"\n### {key.replace('_', ' ')} (acc. = valid %, opt. = optimal %, tokens = mean "
                  f"completion tokens, ours only)\n")
        md.append("| Model | " + " | ".join(f"{s}×{s} acc. | opt." for s in sizes) + " | Sum acc. | opt. |")
        md.append("|---|" + "---|---|" * (len(sizes) + 1))
        for model, cells in models.items():
            vals = [cells.get(s) for s in sizes + ["sum"]]
            md.append(f"| {model} | " + " | ".join("– | –" if v is None else f"{v['acc']:.2f} | {v['opt']:.2f}"
                                                    for v in vals) + " |")
            for s, v in cells.items():
                writer.writerow([key.split("_")[0], model, s, v["acc"], v["opt"], v.get("tokens", "")])
        ours = models.get(label, {})
        if ours:
            md.append(f"\nMean completion tokens ({label}): " + ", ".join(
                f"{s}×{s} {ours[s]['tokens']:.0f}" for s in sizes if s in ours))
    paths = {ext: os.path.join(directory, f"{prefix}.{ext}") for ext in ("md", "csv", "json")}
    io.write_atomic(paths["md"], f"# Results: {entry['point']}\n" + "\n".join(md) + "\n")
    io.write_atomic(paths["csv"], buf.getvalue())
    io.write_atomic(paths["json"], json.dumps({"point": entry["point"], "tables": rows}, indent=1))
    image = rate_heatmap(entry["cells"], title=f"{label}: {entry['point']}")
    png = _io.BytesIO()
    image.save(png, format="PNG")
    paths["png"] = os.path.join(directory, "heatmap.png")
    io.write_atomic(paths["png"], png.getvalue())
    return paths
