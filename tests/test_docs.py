"""The docs match the repository: every relative link, every repository path written in
backticks and every `python -m launch.X` in the README and docs/ exists (the CHANGELOG's links
only: it names files as they were); no doc says something is "not built yet"; every table of
measured figures names its command or raw output and its date; generated tables equal their raw
output (launch/doc_tables.py)."""

import glob
import json
import os
import re
import sys

import pytest

from launch import doc_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def missing(doc: str, paths: bool = True) -> list[str]:
    text = open(os.path.join(ROOT, doc)).read()
    gone = []
    for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in m.group(1) and not os.path.exists(os.path.join(ROOT, os.path.dirname(doc), m.group(1))):
            gone.append(f"link {m.group(1)}")
    if paths:
        for m in re.finditer(r"`((?:t2t_jax|launch|configs|tests|notebooks)/[\w/.\-*]+)`", text):
            path = m.group(1).rstrip("/")
            if not glob.glob(os.path.join(ROOT, path)):
                gone.append(f"path {path}")
        for m in re.finditer(r"python -m (launch\.\w+)", text):
            if not os.path.exists(os.path.join(ROOT, *m.group(1).split(".")) + ".py"):
                gone.append(f"module {m.group(1)}")
    return gone


@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_what_exists(doc):
    assert not missing(doc), missing(doc)


def test_ci_runs_the_readmes_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert 'python -m pytest -q -m "not slow" -n 2' in ci and '-m "slow and not long"' in ci


def test_changelog_links_and_docs_index():
    assert not missing("CHANGELOG.md", paths=False)
    readme = open(os.path.join(ROOT, "README.md")).read()
    unlinked = [d for d in DOCS[1:] if f"]({d})" not in readme]
    assert not unlinked, f"docs the README does not link: {unlinked}"
    assert 'python -m pytest -q -m "not slow" -n 2' in readme
    assert "python -m launch.main --config=configs/stage.py" in readme


UNBUILT = re.compile(
    r"not (?:yet )?built(?: yet)?|not (?:yet )?implemented(?: yet)?|\bTODO\b|\bTBD\b|\bFIXME\b|coming soon", re.I
)


@pytest.mark.parametrize("doc", DOCS)
def test_no_statement_that_something_is_not_built(doc):
    """'not built yet' and the like go stale silently: say what exists and what is missing (an
    issue number) instead."""
    lines = open(os.path.join(ROOT, doc)).read().splitlines()
    flagged = [f"{doc}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if UNBUILT.search(line)]
    assert not flagged, flagged


NUMBER = re.compile(r"[^A-Za-z`]*\d[^A-Za-z`]*")  # a cell of figures: digits, no words
SOURCE = re.compile(r"python -m launch\.\w+|(?:docs|notebooks)/results/[\w/.\-]+")
DATE = re.compile(r"20\d\d-\d\d-\d\d")


def blocks(text: str) -> list[list[str]]:
    """The doc as [kind, line, ...] blocks: a "table", a "heading" (one line) or "prose"."""
    out, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        kind = "prose" if fenced else "table" if line.startswith("|") else "heading" if line[:1] == "#" else "prose"
        if out and out[-1][0] == kind != "heading":
            out[-1].append(line)
        else:
            out.append([kind, line])
    return out


def measured_tables(text: str):
    """(header, context) for each table with a cell of bare figures in half its rows or more (an
    HTTP status in a table of rules is not a measurement); the context is the table and the
    blocks beside it, up to a heading."""
    parts = blocks(text)
    for i, (kind, *lines) in enumerate(parts):
        rows = [[c.strip() for c in row.strip("|").split("|")] for row in lines[2:]]
        if kind == "table" and 2 * sum(any(NUMBER.fullmatch(c) for c in row) for row in rows) >= len(rows):
            yield lines[0], "\n".join(line for b in parts[max(i - 1, 0) : i + 2] if b[0] != "heading" for line in b[1:])


@pytest.mark.parametrize("doc", DOCS)
def test_measured_tables_name_their_source(doc):
    """A table of measured figures has, in the prose beside it (up to a heading), its committed
    raw output (docs/results/..., notebooks/results/...) or its command (`python -m launch...`)
    and the date it was measured; every raw output named exists."""
    bare = []
    for header, context in measured_tables(open(os.path.join(ROOT, doc)).read()):
        raw = [p.rstrip(".") for p in SOURCE.findall(context) if not p.startswith("python")]
        gone = [p for p in raw if not glob.glob(os.path.join(ROOT, p))]
        if gone or not (raw or (SOURCE.search(context) and DATE.search(context))):
            bare.append(f"{header} (missing: {gone or 'a raw output, or a command and a date'})")
    assert not bare, bare


def test_tables_equal_their_raw_output():
    """Each `<!-- table: ... -->` in the docs is what `python -m launch.doc_tables` renders from
    its committed raw output."""
    assert not doc_tables.stale(), "rerun python -m launch.doc_tables"


def test_a_recorded_run_renders_with_its_provenance(tmp_path):
    path = str(tmp_path / "raw.jsonl")
    command = [sys.executable, "-c", 'print(\'{"name": "x_1", "v": 1.23456, "b": 1073741824}\')']
    doc_tables.record(path, command)
    text = doc_tables.render(path, ["name", "v", "b:GiB"], "x_")
    run = json.loads(open(path).readline())
    assert f"`{' '.join(command)}`; commit {run['commit']}" in text and run["date"] in text
    assert text.endswith("| name | v | b (GiB) |\n|---|---|---|\n| x_1 | 1.235 | 1.00 |\n")
