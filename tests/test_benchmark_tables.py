"""The results table: cells from rollouts, the paper's rows beside ours, the files written."""

import json

import numpy as np
import pytest

from t2t_jax.evaluation import benchmark


def entry(valid_rate):
    cells = [
        {"agents": k, "size": n, "boards": 4, "valid": valid_rate, "optimal": valid_rate / 2, "mean_tokens": 10.0 + n}
        for k in (3, 4, 5)
        for n in range(k, 11)
    ]
    return {
        "point": "final",
        "boards": 4 * len(cells),
        "valid": valid_rate,
        "optimal": valid_rate / 2,
        "mean_tokens": 12.0,
        "cells": cells,
    }


def test_benchmark_subset_is_fixed_and_covers_every_cell():
    a, b = benchmark.benchmark_boards(2), benchmark.benchmark_boards(2)
    assert a == b and len(a) == 2 * (8 + 7 + 6)
    assert len(benchmark.benchmark_boards(None)) == 150 * 21


def test_tables_hold_paper_rows_and_ours(tmp_path):
    paths = benchmark.write_tables(str(tmp_path), entry(0.5))
    md = open(paths["md"]).read()
    for model in benchmark.paper_table()["tables"]["3_agents"]:
        assert f"| {model} |" in md
    assert "| ours | 50.00 | 25.00 |" in md and "Mean completion tokens (ours): 3×3 13" in md
    rows = json.load(open(paths["json"]))["tables"]
    assert rows["5_agents"]["ours"]["sum"] == {"acc": 50.0, "opt": 25.0, "tokens": 17.5}
    assert rows["3_agents"]["GPT-5.4"]["sum"]["acc"] == pytest.approx(32.5)
    paper = benchmark.paper_table()["tables"]["4_agents"]["Qwen3-4B + GRPO + Ours"]
    assert np.mean([paper[str(n)]["acc"] for n in range(4, 11)]) == pytest.approx(paper["sum"]["acc"], abs=0.01)
    assert open(paths["csv"]).read().startswith("agents,model,size,acc,opt,tokens")
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_paired_change_counts_boards_gained_and_lost():
    from t2t_jax.evaluation.benchmark import paired_change

    before, after = {"point": "warm_start", "board_valid": "0110"}, {"point": "stage_2", "board_valid": "1100"}
    assert paired_change(before, after) | {"ci95": None} == {
        "against": "warm_start",
        "gained": 1,
        "lost": 1,
        "p_value": 1.0,
        "diff": 0.0,
        "ci95": None,
    }
    # 14 gained, 6 lost: two-sided exact p = 2 * P(Binomial(20, 1/2) <= 6) = 0.1153
    many = {"point": "stage_2", "board_valid": "1" * 14 + "0" * 6 + "11"}
    fewer = {"point": "warm_start", "board_valid": "0" * 14 + "1" * 6 + "11"}
    assert paired_change(fewer, many)["p_value"] == pytest.approx(0.1153, abs=1e-4)
    assert paired_change(fewer, fewer) == {
        "against": "warm_start",
        "gained": 0,
        "lost": 0,
        "p_value": 1.0,
        "diff": 0.0,
        "ci95": [0.0, 0.0],
    }
    with pytest.raises(ValueError, match="warm_start has 4 boards, stage_2 3"):
        paired_change(before, {"point": "stage_2", "board_valid": "110"})


def test_pass_at_k_is_the_unbiased_estimator():
    from itertools import combinations
    from math import comb

    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                draws = list(combinations([1] * c + [0] * (n - c), k))
                brute = np.mean([any(d) for d in draws])
                assert float(benchmark.pass_at_k(n, c, k)) == pytest.approx(brute, abs=1e-9), (n, c, k)
                assert float(benchmark.pass_at_k(n, c, k)) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    np.testing.assert_allclose(benchmark.pass_at_k(8, np.array([0, 2, 8]), 1), [0, 0.25, 1])
    with pytest.raises(ValueError, match="k = 9 exceeds the 8 samples"):
        benchmark.pass_at_k(8, 1, 9)


def test_paired_sampled_change_is_a_sign_flip_test():
    from itertools import product

    before = {"point": "warm_start", "k": 4, "board_valid_counts": [0, 1, 2, 0, 3, 1, 0, 2]}
    after = {"point": "stage_2", "k": 4, "board_valid_counts": [1, 3, 2, 2, 4, 0, 1, 4]}
    out = benchmark.paired_sampled_change(before, after)
    d = (np.array(after["board_valid_counts"]) - before["board_valid_counts"]) / 4
    flips = [abs(np.mean(d * s)) >= abs(d.mean()) - 1e-12 for s in product([1, -1], repeat=len(d))]
    assert out["p_value"] == pytest.approx(np.mean(flips), abs=1e-4)  # exact: 2^8 < the resamples
    assert out["diff"] == pytest.approx(d.mean(), abs=1e-4) and out["ci95"][0] < d.mean() < out["ci95"][1]
    assert out["boards"] == 8 and out["against"] == "warm_start"
    same = benchmark.paired_sampled_change(before, before)
    assert same["p_value"] == 1.0 and same["diff"] == 0 and same["ci95"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="not the same boards"):
        benchmark.paired_sampled_change(before, {**after, "k": 8})


def test_paired_change_reports_the_difference_with_an_interval():
    out = benchmark.paired_change(
        {"point": "a", "board_valid": "0" * 20 + "1" * 10},
        {"point": "b", "board_valid": "1" * 10 + "0" * 10 + "1" * 10},
    )
    assert out["diff"] == pytest.approx(10 / 30, abs=1e-4) and out["ci95"][0] > 0 and out["p_value"] < 0.01


def test_sampled_entry_and_its_table(tmp_path):
    from types import SimpleNamespace

    boards = [{"starts": [[0, 0]] * 3, "size": n} for n in (3, 4)]
    k = 4
    valid = np.array([1, 0, 0, 0, 1, 1, 1, 1], bool)
    ro = SimpleNamespace(
        boards=[b for b in boards for _ in range(k)],
        verdicts=SimpleNamespace(valid=valid, optimal=valid & (np.arange(8) % 2 == 0)),
    )
    s = benchmark.sampled_entry(ro, k, 0.7, 1.0)
    assert s["board_valid_counts"] == [1, 4] and s["avg_valid"] == pytest.approx(5 / 8)
    assert s["pass_valid"] == 1.0 and s["avg_optimal"] == pytest.approx(3 / 8)
    assert [(c["size"], c["avg_valid"], c["pass_valid"]) for c in s["cells"]] == [(3, 0.25, 1.0), (4, 1.0, 1.0)]
    e = {
        **entry(0.5),
        "sampled": {
            **s,
            "cells": [{**c, "agents": a, "size": n} for a in (3, 4, 5) for n in range(a, 11) for c in s["cells"][:1]],
        },
    }
    paths = benchmark.write_tables(str(tmp_path), e)
    md = open(paths["md"]).read()
    assert "avg@4 valid %" in md and "| avg@4 acc. | 25.00 |" in md and "| pass@4 acc. | 100.00 |" in md
    rows = json.load(open(paths["json"]))["tables"]
    assert rows["3_agents"]["ours"]["3"]["avg"] == 25.0 and rows["3_agents"]["ours"]["sum"]["pass"] == 100.0
