"""Issue 33: the table's decoding, pinned and recorded; `launch.table`, the paper's layout merged
from results files, against hand-computed figures."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.config import schema
from t2t_jax.config.defaults import base
from t2t_jax.evaluation import benchmark, decoding, table
from t2t_jax.evaluation.points import EvalSettings
from t2t_jax.sampling.sampler import filter_logits, row_keys, sample_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- decoding ------------------------------------------------------------------------------------


def test_decodings_resolve_and_unused_settings_are_named():
    assert decoding.resolve("qwen3_thinking") == {
        "decoding": "qwen3_thinking",
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    assert decoding.resolve("greedy", 0.9, 0.5, 3)["temperature"] == 0.0
    assert decoding.resolve("sampled", 0.8, 0.9, 40) == {
        "decoding": "sampled",
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 40,
    }
    with pytest.raises(ValueError, match="decoding: 'beam' is not one of"):
        decoding.resolve("beam")
    assert decoding.unused_settings("qwen3_thinking", 1.0, 1.0, 5) == ["top_k"]
    assert decoding.unused_settings("sampled", 0.3, 0.5, 5) == []
    rec = decoding.record(decoding.resolve("qwen3_thinking"), seed=3, max_new_tokens=8192, enable_thinking=True)
    assert decoding.describe(rec) == (
        "qwen3_thinking (temperature 0.6, top-p 0.95, top-k 20), seed 3, max new tokens 8192, thinking on"
    )
    assert decoding.describe(None) == "not recorded"
    assert benchmark.table_decoding(decoding.resolve("greedy"), 0) == {}
    assert benchmark.table_decoding(decoding.resolve("qwen3_thinking"), 7) == dict(
        samples=1, temperature=0.6, top_p=0.95, top_k=20, seed=7
    )


def test_top_k_with_top_p_keeps_the_hand_computed_set_under_jit():
    """The Qwen3 preset in the sampler's token choice: top-20, then the 0.95 nucleus of what is
    left (renormalised), at temperature 0.6; filter_logits and sample_step are pure and jit."""
    logits = jnp.asarray(-0.15 * np.arange(40.0))[None]  # token i less likely than i - 1
    t, k, p = 0.6, 20, 0.95
    scaled = np.asarray(logits[0]) / t
    kept = np.exp(scaled[:k] - scaled[0])
    kept /= kept.sum()
    before = np.cumsum(kept) - kept
    allowed = np.flatnonzero(before < p)  # the nucleus: every token with less than p before it
    assert 1 < len(allowed) < k  # (both filters bite)
    masked = jax.jit(filter_logits)(logits / t, jnp.int32(k), jnp.float32(p))
    assert np.flatnonzero(np.isfinite(np.asarray(masked[0]))).tolist() == allowed.tolist()
    rows = 4000
    keys = row_keys(jax.random.key(0), 0, jnp.arange(rows))
    tokens, logp = jax.jit(sample_step)(keys, jnp.repeat(logits, rows, 0), jnp.float32(t), jnp.int32(k), jnp.float32(p))
    drawn = set(np.asarray(tokens).tolist())
    assert drawn <= set(allowed.tolist()) and len(drawn) > len(allowed) // 2
    full = jax.nn.log_softmax(logits[0] / t)  # the trainer's log-probs: the full softmax
    np.testing.assert_allclose(np.asarray(logp), np.asarray(full)[np.asarray(tokens)], atol=1e-5)
    greedy, _ = sample_step(keys[:2], jnp.repeat(logits, 2, 0), jnp.float32(1.0), jnp.int32(1), jnp.float32(1.0))
    assert np.asarray(greedy).tolist() == [0, 0]  # top-1 is the argmax


def test_eval_config_fields_are_checked_with_the_field_and_range():
    c = base()
    c.eval.top_k = -1
    with pytest.raises(schema.ConfigError, match=r"^eval.top_k: -1 is not"):
        schema.validate(c)
    c.eval.top_k = 40
    with pytest.raises(schema.ConfigError, match=r"^eval.top_k: 40 is read only with eval.decoding='sampled'"):
        schema.validate(c)
    c.eval.decoding = "sampled"
    schema.validate(c)
    assert EvalSettings.from_config(c).decoding == decoding.resolve("sampled", 1.0, 1.0, 40)
    c.eval.decoding = "beam"
    with pytest.raises(schema.ConfigError, match=r"^eval.decoding: 'beam' is not"):
        schema.validate(c)


def test_qwen3_config_states_its_decoding_and_the_baselines_validate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("qwen3_4b", os.path.join(ROOT, "configs", "qwen3_4b.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kinds = {}
    for arg in ("", "grpo_random", "grpo_broad", "grpo_broad,rehearsal"):
        c = module.get_config(arg)
        schema.validate(c)
        assert c.eval.decoding == "qwen3_thinking"
        kinds[arg] = c.engineer.kind
    assert kinds == {"": "self", "grpo_random": "random", "grpo_broad": "fixed", "grpo_broad,rehearsal": "fixed"}
    with pytest.raises(ValueError, match="unknown argument 'x'"):
        module.get_config("x")


class FakeClient:
    """A ChatClient that answers every request with a plan and keeps the requests."""

    api_base, model = "http://127.0.0.1:1/v1", "fake"

    def __init__(self):
        self.requests = []

    def key(self, request):
        return request.key(self.model, self.api_base)

    def complete_many(self, requests, progress=False):
        from t2t_jax.serving.client import Reply

        self.requests += requests
        return [Reply(text="Agent 0: UP", finish_reason="stop") for _ in requests]


def test_a_sampled_table_sends_top_k_and_records_its_decoding(tmp_path):
    from t2t_jax.serving.api_policy import ApiPolicy

    client = FakeClient()
    policy = ApiPolicy(client)
    boards = benchmark.benchmark_boards(1)[:4]
    settings = decoding.resolve("qwen3_thinking")
    kw = dict(max_new_tokens=32, batch_size=2, reward_weights={"valid": 1.0})
    rollouts = benchmark.evaluate(policy, None, boards, **benchmark.table_decoding(settings, 5), **kw)
    assert len(client.requests) == 4
    assert {(r.temperature, r.top_p, r.extra_body.get("top_k")) for r in client.requests} == {(0.6, 0.95, 20)}
    rec = decoding.record(settings, 5, 32, policy.enable_thinking)
    entry = benchmark.results_entry("api", rollouts, decoding=rec)
    assert entry["decoding"] == {**settings, "seed": 5, "max_new_tokens": 32, "enable_thinking": False}
    assert len(entry["board_optimal"]) == 4 and entry["boards_digest"] == benchmark.boards_digest(boards)
    paths = benchmark.write_tables(str(tmp_path), entry, label="api")
    saved = json.load(open(paths["json"]))
    assert saved["decoding"] == entry["decoding"] and saved["label"] == "api" and saved["cells"] == entry["cells"]
    assert "Decoding (api): qwen3_thinking (temperature 0.6, top-p 0.95, top-k 20), seed 5" in open(paths["md"]).read()
    greedy = ApiPolicy(client).requests(boards[:1], 1, 8, 0.0, 1.0, 0, top_k=20)
    assert "top_k" not in greedy[0].extra_body  # (greedy sends no sampling settings)


# -- the merged table ----------------------------------------------------------------------------


def results(valid: dict, optimal: dict, n: int, label: str, digest: str = "d0") -> dict:
    """A synthetic results_table.json: for each (agents, size) the valid / optimal board flags."""
    cells, bv, bo = [], "", ""
    for key in sorted(valid):
        v, o = valid[key], optimal[key]
        assert len(v) == len(o) == n
        cells.append(
            {"agents": key[0], "size": key[1], "boards": n, "valid": v.count("1") / n, "optimal": o.count("1") / n}
        )
        bv, bo = bv + v, bo + o
    return {
        "point": "final",
        "label": label,
        "cells": cells,
        "board_valid": bv,
        "board_optimal": bo,
        "boards_digest": digest,
        "decoding": decoding.record(decoding.resolve("greedy"), 0, 64),
    }


# Two rows on the same 4 boards per cell of the 3-agent table at sizes 3 and 4.
A = results({(3, 3): "1100", (3, 4): "0000"}, {(3, 3): "1000", (3, 4): "0000"}, 4, "a")
B = results({(3, 3): "1111", (3, 4): "1110"}, {(3, 3): "1100", (3, 4): "1000"}, 4, "b")


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_merged_table_against_hand_computed_figures(tmp_path):
    rows = [table.load_row(write(tmp_path, "a.json", A)), table.load_row(write(tmp_path, "b.json", B), "B")]
    merged = table.build(rows, resamples=2000)
    a, b = merged["tables"]["3_agents"]["a"], merged["tables"]["3_agents"]["B"]
    # acc.: a 2/4 and 0/4 -> 50, 0, Sum 25; b 4/4 and 3/4 -> 100, 75, Sum 87.5
    assert (a["3"]["acc"], a["4"]["acc"], a["sum"]["acc"]) == (50.0, 0.0, 25.0)
    assert (b["3"]["acc"], b["4"]["acc"], b["sum"]["acc"]) == (100.0, 75.0, 87.5)
    assert (b["3"]["opt"], b["4"]["opt"], b["sum"]["opt"]) == (50.0, 25.0, 37.5)
    # Wilson 95% for 3/4 (the textbook figure): 30.06-95.44; for 0/4: 0-48.99; for 4/4: 51.01-100
    assert (
        b["4"]["acc_ci"] == [30.06, 95.44] and a["4"]["acc_ci"] == [0.0, 48.99] and b["3"]["acc_ci"] == [51.01, 100.0]
    )
    # Sum's bootstrap: a's only varying cell is 2/4 at size 3 (half of Sum), so Sum's draws are
    # Binomial(4, 1/2) / 8: the 2.5 and 97.5 percentiles are 0/8 and 4/8.
    assert a["sum"]["acc_ci"] == [0.0, 50.0] and b["sum"]["acc_ci"][1] == 100.0
    # opt.: Binomial(4, 1/4) / 8 at size 3, whose 97.5th percentile is 3 of 4 (P(X <= 2) = 0.949)
    assert a["sum"]["opt_ci"] == [0.0, 37.5]
    assert "4_agents" in merged["tables"] and "a" not in merged["tables"]["4_agents"]
    # The paper's rows beside ours, their published Sum and an interval at 150 boards per cell.
    base = merged["tables"]["3_agents"]["Qwen3-4B (base) [paper]"]
    assert base["sum"]["acc"] == 14.83 and base["3"]["n"] == 150 and base["3"]["acc_ci"] == [32.5, 48.0]
    assert merged["source"] == benchmark.paper_table()["source"]
    gpt = merged["tables"]["3_agents"]["GPT-5.4 [paper]"]["9"]
    assert gpt["opt"] == 11.31 and gpt["opt_ci"] == [round(100 * x, 2) for x in table.wilson(17, 150)]
    # The paired test on Sum: acc. gained 5 (3 at size 3... 2 at 3x3, 3 at 4x4), lost 0:
    # exact McNemar p = 2 / 2^5 = 0.0625; B - A = 5/8 of the boards = 62.5 points.
    acc = next(t for t in merged["paired"] if t["metric"] == "acc")
    assert (acc["table"], acc["a"], acc["b"], acc["gained"], acc["lost"], acc["boards"]) == (
        "3_agents",
        "a",
        "B",
        5,
        0,
        8,
    )
    assert acc["p_value"] == 0.0625 and acc["diff"] == 62.5 == b["sum"]["acc"] - a["sum"]["acc"]
    opt = next(t for t in merged["paired"] if t["metric"] == "opt")
    assert (opt["gained"], opt["lost"], opt["p_value"]) == (2, 0, 0.5)


def test_sum_interval_matches_the_normal_approximation():
    counts, boards = np.array([30, 60, 90]), np.array([150, 150, 150])
    low, high = table.sum_interval(counts, boards, resamples=40000, seed=1)
    p = counts / boards
    sd = np.sqrt(np.sum(p * (1 - p) / boards)) / 3
    assert low == pytest.approx(p.mean() - 1.96 * sd, abs=0.004) and high == pytest.approx(
        p.mean() + 1.96 * sd, abs=0.004
    )
    assert table.sum_interval([0, 0], [10, 10]) == [0.0, 0.0]


def test_paired_tests_refuse_rows_on_different_boards(tmp_path):
    other = {**B, "boards_digest": "d1"}
    a, b = table.load_row(write(tmp_path, "a.json", A)), table.load_row(write(tmp_path, "o.json", other))
    with pytest.raises(ValueError, match=r"a and b were scored on different boards \(digests d0, d1\)"):
        table.build([a, b], pairs=[("a", "b")])
    merged = table.build([a, b], pairs="all", resamples=200)  # "all": noted, not tested
    assert merged["paired"] == [] and "different boards" in merged["notes"][0]
    fewer = results({(3, 3): "11", (3, 4): "00"}, {(3, 3): "10", (3, 4): "00"}, 2, "c", digest="")
    c = table.load_row(write(tmp_path, "c.json", fewer))
    assert "boards per cell" in table.same_boards(a, c)
    with pytest.raises(ValueError, match="no row labelled 'z'"):
        table.build([a, b], pairs=[("a", "z")])


def test_a_run_results_json_gives_its_last_point_or_the_named_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = {**A, "point": "warm_start"}
    last = {**B, "point": "stage_2"}
    (run / "results.json").write_text(json.dumps([first, last]))
    assert table.load_row(str(run)).label == "run:stage_2"
    assert table.load_row(str(run / "results.json") + "#warm_start").cells[(3, 3)] == (4, 2, 1)
    with pytest.raises(Exception, match=r"no point 'stage_9'"):
        table.load_row(str(run / "results.json") + "#stage_9")


def launch_table(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "launch.table", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_launch_table_writes_markdown_csv_json_and_a_figure(tmp_path):
    out = tmp_path / "out"
    done = launch_table(
        f"A={write(tmp_path, 'a.json', A)}", write(tmp_path, "b.json", B), f"--out={out}", "--resamples=500"
    )
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout.strip().splitlines()[-1])
    md = open(paths["md"]).read()
    assert "| A | 50.00 (15.0–85.0) | 25.00 (4.6–69.9) | 0.00 (0.0–49.0) |" in md
    assert "| 3 agents | acc. | A | b | +62.50 |" in md and "Qwen3-4B + GRPO + Ours [paper]" in md
    assert "greedy (temperature 0), max new tokens 64" in md
    lines = open(paths["csv"]).read().splitlines()
    assert lines[0] == "agents,model,paper,size,n,acc,acc_lo,acc_hi,opt,opt_lo,opt_hi"
    assert "3,A,False,sum,8,25.0,0.0,50.0,12.5,0.0,37.5" in lines
    assert json.load(open(paths["json"]))["paired"][0]["p_value"] == 0.0625
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "case, expect",
    [
        ("missing", "missing.json: No such file or directory"),
        ("malformed", "bad.json"),
        ("different", "a and b were scored on different boards"),
        ("none", "give at least one results file"),
        ("old", "no per-cell board counts"),
    ],
)
def test_launch_table_bad_inputs_are_one_line(tmp_path, case, expect):
    a = write(tmp_path, "a.json", A)
    args = {
        "missing": [str(tmp_path / "missing.json")],
        "malformed": [write(tmp_path, "bad.json", '{"cells": [')],
        "different": [a, write(tmp_path, "o.json", {**B, "boards_digest": "d1"}), "--paired=a:b"],
        "none": [],
        "old": [write(tmp_path, "old.json", {"point": "final", "tables": {}, "board_valid": "01"})],
    }[case]
    done = launch_table(*args, f"--out={tmp_path / 'out'}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and expect in lines[-1] and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # (nothing written)


@pytest.mark.parametrize(
    "flags, expect",
    [
        (["--top_k=-1"], "flag --top_k=-1: -1 is not an integer in the range [0, 1000000]"),
        (["--decoding=beam"], "--decoding: 'beam' is not one of ['greedy', 'sampled', 'qwen3_thinking']"),
        (["--decoding=qwen3_thinking", "--top_k=5"], "--top_k: --decoding=qwen3_thinking fixes it (20)"),
        (["--decoding=sampled", "--temperature=0"], "--temperature 0.0 must be > 0 with --samples or --decoding"),
    ],
)
def test_launch_eval_refuses_bad_decoding_flags_in_one_line(tmp_path, flags, expect):
    done = subprocess.run(
        [sys.executable, "-m", "launch.eval", f"--hf={tmp_path}", f"--out={tmp_path / 'out'}", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and expect in lines[-1] and "Traceback" not in done.stderr, done.stderr
