"""The paper's results table: evaluate a policy on the benchmark sets, tabulate acc./opt. per
map size for 3, 4 and 5 agents (Sum = the mean over sizes), beside the paper's reported rows.

    boards = benchmark_boards(per_cell=None)                  # all 150 per cell, or a subset
    rollouts = evaluate(policy, params, boards, max_new_tokens=512, batch_size=64)
    sampled = evaluate(policy, params, boards, ..., samples=8, temperature=0.7)  # avg@8, pass@8
    entry = results_entry("final", rollouts, sampled, decoding=rec)  # {"point", "valid", "cells", ...}
    write_tables(workdir, entry)                              # results_table.{md,csv,json}, heatmap.png

The table scores one completion per board: greedy (temperature 0) by default, or one sample per
board at a named decoding (`decoding.py`: `qwen3_thinking` is Qwen3's advice for thinking mode;
`evaluate(..., **table_decoding(settings, seed))`); the entry records it (`decoding`). With
`samples` = k > 0, k completions per board at the given temperature give avg@k (the mean over the
samples) and pass@k (at least one of them; the unbiased estimator of Chen et al. 2021, `pass_at_k`).
Batches have a fixed size (the last one padded by repetition), so a run compiles one decode
shape per prompt-length bucket. Two points on the same boards compare paired: `paired_change`
(greedy, exact McNemar) and `paired_sampled_change` (avg@k, a paired permutation test).
"""

from __future__ import annotations

import csv
import hashlib
import io as _io
import json
import os

import numpy as np
from tqdm import tqdm

from t2t_jax import storage
from t2t_jax.env import io
from t2t_jax.evaluation import sets
from t2t_jax.evaluation.decoding import describe
from t2t_jax.rollout import concat

PAPER_TABLE = os.path.join(os.path.dirname(__file__), "data", "paper_table.json")
AGENT_SETS = {3: "mapf_3_agents", 4: "mapf_4_agents", 5: "mapf_5_agents"}
# entry keys results_table.json carries beside the tables (launch.table reads them)
RECORDED = ("decoding", "cells", "board_optimal", "boards_digest", "usage")


def paper_table() -> dict:
    """The paper's reported figures: tables["3_agents"][model][size or "sum"] = {acc, opt} in %."""
    with open(PAPER_TABLE) as f:
        return json.load(f)


def set_boards(names, per_cell: int | None = None) -> list[dict]:
    """The named eval sets' boards in file order; `per_cell` keeps the first that many of each
    (agents, size) cell (a fixed subset: the same boards every time)."""
    out = []
    for name in names:
        counts: dict = {}
        for b in sets.load(name):
            key = (len(b["starts"]), b["size"])
            counts[key] = counts.get(key, 0) + 1
            if per_cell is None or counts[key] <= per_cell:
                out.append(b)
    return out


def benchmark_boards(per_cell: int | None = None) -> list[dict]:
    """The paper's benchmark sets (3, 4 and 5 agents): `set_boards(sets.BENCHMARK, per_cell)`."""
    return set_boards(sets.BENCHMARK, per_cell)


def evaluate_ood(policy, params, names, per_cell: int | None = None, **kw) -> dict:
    """{set name: results_entry} of out-of-distribution sets, each under the policy padded to the
    set's agent count (`evaluate`'s keyword arguments in `kw`: greedy, or `table_decoding`'s)."""
    out = {}
    for name in names:
        wide = policy.padded_to(sets.SETS[name].max_agents)
        rollouts = evaluate(wide, params, set_boards([name], per_cell), desc=name, **kw)
        entry = results_entry(name, rollouts)
        out[name] = {k: entry[k] for k in ("boards", "valid", "optimal", "mean_tokens", "cells")}
    return out


def table_header(sizes, first: str = "Model") -> list[str]:
    """The two Markdown header lines of the paper's layout: `first`, acc. / opt. per map size, Sum."""
    return [
        f"| {first} | " + " | ".join(f"{s}×{s} acc. | opt." for s in sizes) + " | Sum acc. | opt. |",
        "|---|" + "---|---|" * (len(sizes) + 1),
    ]


def ood_markdown(ood: dict) -> list[str]:
    """Markdown lines: one table per OOD set, our valid / optimal % per map size and their mean."""
    md = []
    for name, e in ood.items():
        cells = sorted(e["cells"], key=lambda c: c["size"])
        agents = sorted({c["agents"] for c in cells})
        md.append(f"\n### {name} (out of distribution: {', '.join(map(str, agents))} agents; ours only)\n")
        md += table_header([c["size"] for c in cells], first="")
        acc = [100 * c["valid"] for c in cells]
        opt = [100 * c["optimal"] for c in cells]
        md.append(
            "| ours | "
            + " | ".join(f"{a:.2f} | {o:.2f}" for a, o in zip(acc, opt))
            + f" | {np.mean(acc):.2f} | {np.mean(opt):.2f} |"
        )
    return md


def evaluate(
    policy,
    params,
    boards,
    *,
    max_new_tokens: int,
    batch_size: int,
    reward_weights: dict,
    progress: bool = False,
    desc: str = "eval",
    samples: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    check=None,
):
    """Rollouts of every board in board order: greedy, one per board (`samples` = 0), or
    `samples` = k sampled at `temperature` / `top_p` / `top_k` (row i * k + j: sample j of board i; about
    `batch_size` rows per decode call; the seed fixes the draws, so two evaluations with one
    seed share their random numbers and differ only where the policy does). `check()`, when
    given, is called before each decode call and may raise to stop early (the stage loop's SIGTERM)."""
    n = max(samples, 1)
    per_call = max(batch_size // n, 1)
    parts = []
    for i, start in enumerate(tqdm(range(0, len(boards), per_call), desc=desc, disable=not progress)):
        if check is not None:
            check()
        chunk = list(boards[start : start + per_call])
        real = len(chunk)
        chunk += [chunk[-1]] * (per_call - real)
        out = policy.rollout(
            params,
            chunk,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature if samples else 0.0,
            top_k=top_k if samples else 0,
            top_p=top_p if samples else 1.0,
            reward_weights=reward_weights,
            seed=seed * 1_000_003 + i,
        )
        parts.append(out.select(range(real * n)))
    return concat(parts)


def table_decoding(settings: dict, seed: int) -> dict:
    """`evaluate`'s keyword arguments for the table's one completion per board under `settings`
    (`decoding.resolve`): none for greedy, else one sample per board at its settings, seeded."""
    if not settings["temperature"]:
        return {}
    return dict(
        samples=1, temperature=settings["temperature"], top_p=settings["top_p"], top_k=settings["top_k"], seed=seed
    )


def boards_digest(boards) -> str:
    """A short fingerprint of a board list in order (the first 16 hex digits of a sha256 of its
    JSON): two results files with the same digest scored the same boards."""
    blob = json.dumps([dict(b) for b in boards], sort_keys=True, default=lambda x: np.asarray(x).tolist())
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def pass_at_k(n, c, k: int):
    """The unbiased pass@k of Chen et al. (2021), 1 - C(n - c, k) / C(n, k), for c of n samples
    correct (arrays broadcast; k <= n)."""
    from scipy.special import gammaln

    n, c = np.asarray(n, np.float64), np.asarray(c, np.float64)
    if np.any(k > n):
        raise ValueError(f"pass_at_k: k = {k} exceeds the {int(np.min(n))} samples")
    m = np.maximum(n - c - k, 0)  # where n - c < k, every draw of k holds a correct sample
    log_ratio = gammaln(n - c + 1) - gammaln(m + 1) - gammaln(n + 1) + gammaln(n - k + 1)
    return np.where(n - c < k, 1.0, 1.0 - np.exp(log_ratio))


def sampled_stats(valid_counts, optimal_counts, k: int) -> dict:
    """Per-board counts of valid / optimal samples [B] (of k each) -> avg@k and pass@k."""
    return {
        "k": k,
        "avg_valid": float(np.mean(valid_counts) / k),
        "avg_optimal": float(np.mean(optimal_counts) / k),
        "pass_valid": float(np.mean(pass_at_k(k, valid_counts, k))),
        "pass_optimal": float(np.mean(pass_at_k(k, optimal_counts, k))),
    }


def sampled_entry(rollouts, k: int, temperature: float, top_p: float, top_k: int = 0) -> dict:
    """k samples per board (rows i * k + j) -> avg@k / pass@k overall and per (agents, size)
    cell, with `board_valid_counts` (valid samples per board, board order) for paired tests."""
    boards = rollouts.boards[::k]
    valid = np.asarray(rollouts.verdicts.valid).reshape(-1, k).sum(axis=1)
    optimal = np.asarray(rollouts.verdicts.optimal).reshape(-1, k).sum(axis=1)
    keys = np.array([(len(b["starts"]), b["size"]) for b in boards])
    cells = [
        {"agents": int(a), "size": int(n), **sampled_stats(valid[rows], optimal[rows], k)}
        for a, n in sorted({tuple(x) for x in keys.tolist()})
        for rows in [np.flatnonzero((keys[:, 0] == a) & (keys[:, 1] == n))]
    ]
    return {
        **sampled_stats(valid, optimal, k),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": int(top_k),
        "boards": len(boards),
        "cells": cells,
        "board_valid_counts": valid.astype(int).tolist(),
    }


def results_entry(
    point: str,
    rollouts,
    sampled=None,
    *,
    k: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    decoding: dict | None = None,
) -> dict:
    """One evaluation point: overall `valid` / `optimal` fractions, per (agents, size) cells,
    `board_valid` and `board_optimal`, one '0'/'1' per board in board order (for paired
    comparisons), and `boards_digest`; with `decoding` (`decoding.record`) how it was decoded; with
    `sampled` (k samples per board of the same boards, `evaluate(..., samples=k)`) also "sampled":
    `sampled_entry`."""
    keys = np.array([(len(b["starts"]), b["size"]) for b in rollouts.boards])
    valid, optimal = np.asarray(rollouts.verdicts.valid), np.asarray(rollouts.verdicts.optimal)
    cells = []
    for a, n in sorted({tuple(x) for x in keys.tolist()}):
        rows = np.flatnonzero((keys[:, 0] == a) & (keys[:, 1] == n))
        cells.append(
            {
                "agents": int(a),
                "size": int(n),
                "boards": int(len(rows)),
                "valid": float(valid[rows].mean()),
                "optimal": float(optimal[rows].mean()),
                "mean_tokens": float(np.mean(rollouts.lengths[rows])),
            }
        )
    entry = {
        "point": point,
        "boards": len(rollouts.boards),
        "valid": float(valid.mean()),
        "optimal": float(optimal.mean()),
        "mean_tokens": float(np.mean(rollouts.lengths)),
        "cells": cells,
        "board_valid": "".join("1" if v else "0" for v in valid),
        "board_optimal": "".join("1" if v else "0" for v in optimal),
        "boards_digest": boards_digest(rollouts.boards),
    }
    if decoding is not None:
        entry["decoding"] = decoding
    if sampled is not None:
        entry["sampled"] = sampled_entry(sampled, k, temperature, top_p, top_k)
    return entry


def _mean_interval(d) -> list[float]:
    """The 95% t-interval of the mean of paired differences d [B] ([0, 0] when all are equal)."""
    from scipy.stats import ttest_1samp

    d = np.asarray(d, np.float64)
    if len(d) < 2 or np.all(d == d[0]):
        return [float(d.mean()) if len(d) else 0.0] * 2
    ci = ttest_1samp(d, 0.0).confidence_interval(0.95)
    return [round(float(ci.low), 4), round(float(ci.high), 4)]


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
    d = np.array([int(y) - int(x) for x, y in zip(a, b)])
    return {
        "against": before["point"],
        "gained": gained,
        "lost": lost,
        "p_value": round(float(p), 4),
        "diff": round(float(d.mean()), 4) if len(d) else 0.0,
        "ci95": _mean_interval(d),
    }


def paired_sampled_change(before: dict, after: dict, resamples: int = 9999) -> dict:
    """Two sampled summaries (`sampled_entry`) of the same boards -> the change in avg@k valid:
    {"against", "diff" (after - before), "ci95" (its 95% t-interval over boards), "p_value" (a
    two-sided paired permutation test: each board's difference flips sign at random, seeded),
    "boards"}."""
    from scipy.stats import permutation_test

    a, b = np.asarray(before["board_valid_counts"]), np.asarray(after["board_valid_counts"])
    if a.shape != b.shape or before["k"] != after["k"]:
        raise ValueError(
            f"paired_sampled_change: {len(a)} boards x {before['k']} samples against "
            f"{len(b)} x {after['k']}: not the same boards"
        )
    d = (b - a) / after["k"]
    if np.all(d == 0):
        p = 1.0
    else:
        p = permutation_test(
            (d,), np.mean, permutation_type="samples", n_resamples=resamples, alternative="two-sided", random_state=0
        ).pvalue
    return {
        "against": before.get("point", ""),
        "diff": round(float(d.mean()), 4),
        "ci95": _mean_interval(d),
        "p_value": round(float(p), 4),
        "boards": int(len(d)),
    }


def table_rows(entry: dict, label: str = "ours") -> dict:
    """entry -> {"3_agents": {model: {size: {acc, opt, tokens?, avg?, pass?}, "sum": ...}}} with
    the paper's rows first and ours (in %) last; Sum is the mean over the sizes present; `avg` /
    `pass` are our avg@k / pass@k valid rates when the entry has "sampled"."""
    paper = paper_table()["tables"]
    sampled = {(c["agents"], c["size"]): c for c in entry.get("sampled", {}).get("cells", [])}
    out = {}
    for k in AGENT_SETS:
        ours = {}
        for c in entry["cells"]:
            if c["agents"] == k:
                cell = {
                    "acc": round(100 * c["valid"], 2),
                    "opt": round(100 * c["optimal"], 2),
                    "tokens": round(c["mean_tokens"], 1),
                }
                if (k, c["size"]) in sampled:
                    s = sampled[(k, c["size"])]
                    cell.update(
                        avg=round(100 * s["avg_valid"], 2),
                        opt_avg=round(100 * s["avg_optimal"], 2),
                        **{"pass": round(100 * s["pass_valid"], 2)},
                    )
                ours[str(c["size"])] = cell
        if ours:
            ours["sum"] = {
                m: round(float(np.mean([v[m] for v in ours.values()])), 2)
                for m in ("acc", "opt", "tokens", "avg", "opt_avg", "pass")
                if m in next(iter(ours.values()))
            }
        out[f"{k}_agents"] = {**paper.get(f"{k}_agents", {}), label: ours}
    return out


def write_tables(directory: str, entry: dict, label: str = "ours", prefix: str = "results_table") -> dict:
    """Markdown, CSV and JSON tables (and `heatmap.png`) of one evaluation point. Returns paths."""
    from t2t_jax.render.heatmap import rate_heatmap

    storage.makedirs(directory)  # (a local directory or a gs:// prefix)
    rows = table_rows(entry, label)
    md, buf = [], _io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["agents", "model", "size", "acc", "opt", "tokens", "avg_acc", "avg_opt", "pass_acc"])
    for key, models in rows.items():
        sizes = sorted({s for m in models.values() for s in m if s != "sum"}, key=int)
        md.append(
            f"\n### {key.replace('_', ' ')} (acc. = valid %, opt. = optimal %, tokens = mean "
            f"completion tokens, ours only)\n"
        )
        md += table_header(sizes)
        for model, cells in models.items():
            vals = [cells.get(s) for s in sizes + ["sum"]]
            md.append(
                f"| {model} | "
                + " | ".join("– | –" if v is None else f"{v['acc']:.2f} | {v['opt']:.2f}" for v in vals)
                + " |"
            )
            for s, v in cells.items():
                writer.writerow(
                    [
                        key.split("_")[0],
                        model,
                        s,
                        v["acc"],
                        v["opt"],
                        v.get("tokens", ""),
                        v.get("avg", ""),
                        v.get("opt_avg", ""),
                        v.get("pass", ""),
                    ]
                )
        ours = models.get(label, {})
        if ours:
            md.append(
                f"\nMean completion tokens ({label}): "
                + ", ".join(f"{s}×{s} {ours[s]['tokens']:.0f}" for s in sizes if s in ours)
            )
        if "avg" in ours.get("sum", {}):
            k, t = entry["sampled"]["k"], entry["sampled"]["temperature"]
            md.append(
                f"\n{label}, {k} samples per board at T={t}: avg@{k} valid % | avg@{k} optimal % | pass@{k} valid %\n"
            )
            md.append("| | " + " | ".join(f"{s}×{s}" for s in sizes) + " | Sum |")
            md.append("|---|" + "---|" * (len(sizes) + 1))
            for m, name in (("avg", f"avg@{k} acc."), ("opt_avg", f"avg@{k} opt."), ("pass", f"pass@{k} acc.")):
                md.append(
                    f"| {name} | "
                    + " | ".join(f"{ours[s][m]:.2f}" if s in ours else "–" for s in sizes + ["sum"])
                    + " |"
                )
    if entry.get("ood"):
        md += ood_markdown(entry["ood"])
    md.append(f"\nDecoding ({label}): {describe(entry.get('decoding'))}.")
    if entry.get("usage"):
        u = entry["usage"]
        md.append(
            f"\nAPI usage: {u['requests']} requests ({u['cached']} from the cache), {u['prompt_tokens']} prompt "
            f"tokens, {u['completion_tokens']} completion tokens, {u['errors']} failed after retries "
            "(scored as unparsable answers)."
        )
    paths = {ext: storage.join(directory, f"{prefix}.{ext}") for ext in ("md", "csv", "json")}
    io.write_atomic(paths["md"], f"# Results: {entry['point']}\n" + "\n".join(md) + "\n")
    io.write_atomic(paths["csv"], buf.getvalue())
    io.write_atomic(
        paths["json"],
        json.dumps(
            {
                "point": entry["point"],
                "label": label,
                "tables": rows,
                "ood": entry.get("ood", {}),
                "board_valid": entry.get("board_valid", ""),
                **{k: entry[k] for k in RECORDED if entry.get(k)},
            },
            indent=1,
        ),
    )
    paths["png"] = storage.join(directory, "heatmap.png")
    io.write_png(paths["png"], rate_heatmap(entry["cells"], title=f"{label}: {entry['point']}"))
    return paths
