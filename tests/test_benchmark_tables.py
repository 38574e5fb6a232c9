"""The results table: cells from rollouts, the paper's rows beside ours, the files written."""
import json

import numpy as np
import pytest

from t2t_jax.evaluation import benchmark


def entry(valid_rate):
    cells = [{"agents": k, "size": n, "boards": 4, "valid": valid_rate, "optimal": valid_rate / 2,
              "mean_tokens": 10.0 + n} for k in (3, 4, 5) for n in range(k, 11)]
    return {"point": "final", "boards": 4 * len(cells), "valid": valid_rate, "optimal": valid_rate / 2,
            "mean_tokens": 12.0, "cells": cells}


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
    assert paired_change(before, after) == {"against": "warm_start", "gained": 1, "lost": 1, "p_value": 1.0}
    # 14 gained, 6 lost: two-sided exact p = 2 * P(Binomial(20, 1/2) <= 6) = 0.1153
    many = {"point": "stage_2", "board_valid": "1" * 14 + "0" * 6 + "11"}
    fewer = {"point": "warm_start", "board_valid": "0" * 14 + "1" * 6 + "11"}
    assert paired_change(fewer, many)["p_value"] == pytest.approx(0.1153, abs=1e-4)
    assert paired_change(fewer, fewer) == {"against": "warm_start", "gained": 0, "lost": 0, "p_value": 1.0}
    with pytest.raises(ValueError, match="warm_start has 4 boards, stage_2 3"):
        paired_change(before, {"point": "stage_2", "board_valid": "110"})
