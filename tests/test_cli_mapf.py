"""`python -m launch.mapf`: generate, show, validate, stats, and bad input."""

import json
import subprocess
import sys

import pytest

CONFIG = '{"buckets": [{"size": [3, 5], "agents": 2, "hole_density": [0.0, 0.3]}]}'


def mapf(*args):
    return subprocess.run([sys.executable, "-m", "launch.mapf", *args], capture_output=True, text=True, timeout=300)


def test_generate_show_validate(tmp_path):
    boards = tmp_path / "boards.jsonl"
    out = mapf("generate", f"--config={CONFIG}", "--num=6", f"--out={boards}", "--seed=3")
    assert out.returncode == 0, out.stderr
    items = [json.loads(line) for line in boards.read_text().splitlines()]
    assert len(items) == 6 and all(3 <= b["size"] <= 5 and len(b["starts"]) == 2 for b in items)

    shown = mapf("show", f"--boards={boards}", "--limit=2")
    assert shown.returncode == 0 and shown.stdout.count("# board") == 2

    plans = tmp_path / "plans.jsonl"
    lines = [{"text": "Agent 0: STAY\nAgent 1: STAY"}] * 5 + [{"text": "I give up"}]
    plans.write_text("".join(json.dumps(p) + "\n" for p in lines))
    checked = mapf("validate", f"--boards={boards}", f"--plans={plans}")
    assert checked.returncode == 0, checked.stderr
    verdicts = [json.loads(line) for line in checked.stdout.splitlines()]
    assert len(verdicts) == 6
    assert all(not v["valid"] and v["parse_status"] == "ok" for v in verdicts[:5])  # starts != goals
    assert verdicts[5]["parse_error"] and verdicts[5]["parse_status"] == "no_answer"


def test_stats_and_errors(tmp_path):
    out = mapf("stats", f"--config={CONFIG}", "--num=256")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.splitlines()[0])
    assert row["boards"] == 256 and row["candidates"] + row["corridors"] + row["line"] == pytest.approx(1)

    bad = mapf(
        "generate",
        '--config={"buckets": [{"size": 3, "agents": 5, "hole_density": 0.5}]}',
        f"--out={tmp_path / 'x.jsonl'}",
    )
    assert bad.returncode == 2 and "unsatisfiable" in bad.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("flag", ["--num=0", "--chunk=0", "--horizon=0", "--cell=100000", "--max_size=99"])
def test_out_of_range_flags_are_refused_before_any_work(tmp_path, flag):
    out = mapf("generate", f"--config={CONFIG}", f"--out={tmp_path / 'x.jsonl'}", flag)
    assert out.returncode != 0 and f"flag {flag}" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.jsonl").exists()
