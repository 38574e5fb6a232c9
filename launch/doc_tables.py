"""The measured tables of the docs, rendered from their committed raw outputs.

    python -m launch.doc_tables                 # rewrite every table from its raw file
    python -m launch.doc_tables --check         # exit 1 naming each table that differs
    python -m launch.doc_tables --record=docs/results/bench/NAME.jsonl -- python -m launch.bench_env ...

A table sits between `<!-- table: PATH COLUMNS [PREFIX] -->` and `<!-- end table -->` in a doc:
PATH a JSON-lines file (from the repository's root), a command's output as it printed it, after
a first line that records the run (command, commit, date, machine) when `--record` wrote it
(else the doc says where the file came from); COLUMNS the comma-separated keys shown (`KEY:GiB`
shows bytes in GiB); PREFIX keeps the rows whose `name` starts with it. Each row is a line that
has every column. tests/test_docs.py fails when a doc's table differs from its rendering.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
TABLE = re.compile(r"(<!-- table: (\S+) (\S+)(?: (\S+))? -->\n).*?(<!-- end table -->)", re.S)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, AttributeError):
        return "unknown CPU"


def record(path: str, command: list[str]) -> None:
    """Run `command` from the repository's root and write its stdout to `path` after one line
    recording the run; nothing is written if it fails."""
    started, load, t = datetime.datetime.now(datetime.UTC), os.getloadavg()[0], time.time()
    out = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode:
        sys.exit(f"error: {' '.join(command)} exited {out.returncode}; nothing written")
    run = {
        "name": "run",
        "command": " ".join(command),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "code_changes": _git("status", "--porcelain", "--", "t2t_jax", "launch", "configs").splitlines(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": _machine(),
        "cpus": os.cpu_count(),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "wall_s": round(time.time() - t, 1),
    }
    with open(os.path.join(ROOT, path), "w") as f:
        f.write(json.dumps(run) + "\n" + out.stdout)


def _cell(value, unit: str) -> str:
    if unit == "GiB":
        return f"{value / 2**30:.2f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)


def render(path: str, columns: list[str], prefix: str = "", doc: str = "README.md") -> str:
    """The provenance line (linked from `doc`) and the markdown table of `path`'s rows."""
    lines = [json.loads(line) for line in open(os.path.join(ROOT, path)) if line.strip()]
    run = lines[0] if lines[0].get("name") == "run" else None
    keys = [c.partition(":") for c in columns]
    rows = [r for r in lines if r is not run and all(k in r for k, _, _ in keys)]
    rows = [r for r in rows if r.get("name", "").startswith(prefix)]
    source = f"Raw output: [{os.path.basename(path)}]({os.path.relpath(path, os.path.dirname(doc))})"
    if run:
        changes = f", with uncommitted changes to {', '.join(run['code_changes'])}" if run["code_changes"] else ""
        source += (
            f" (`{run['command']}`; commit {run['commit']}{changes}; {run['date']}; {run['machine']}, "
            f"{run['cpus']} CPUs, load average {run['load_before']} before, {run['load_after']} after; "
            f"{run['wall_s']} s)"
        )
    table = ["| " + " | ".join(f"{k} ({u})" if u else k for k, _, u in keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(_cell(r[k], u) for k, _, u in keys) + " |" for r in rows]
    return source + ".\n\n" + "\n".join(table) + "\n"


def rendered(text: str, doc: str) -> str:
    """`doc`'s `text` with every table replaced by its rendering."""
    return TABLE.sub(lambda m: m[1] + render(m[2], m[3].split(","), m[4] or "", doc) + m[5], text)


def stale(docs: list[str] = DOCS) -> list[str]:
    """Docs with a table that differs from its rendering."""
    return [doc for doc in docs if (text := open(os.path.join(ROOT, doc)).read()) != rendered(text, doc)]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--check"]:
        differ = stale()
        if differ:
            sys.exit(f"tables that differ from their raw output: {differ} (python -m launch.doc_tables)")
    elif argv[:1] and argv[0].startswith("--record=") and argv[1:2] == ["--"]:
        record(argv[0].split("=", 1)[1], argv[2:])
    elif not argv:
        for doc in stale():
            path = os.path.join(ROOT, doc)
            text = rendered(open(path).read(), doc)
            with open(path, "w") as f:
                f.write(text)
            print(f"rewrote {doc}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
