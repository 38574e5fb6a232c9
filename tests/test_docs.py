"""The docs match the repository: every relative link, every repository path written in
backticks and every `python -m launch.X` in the README and docs/ exists (the CHANGELOG's links
only: it names files as they were)."""

import glob
import os
import re

import pytest

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


def test_changelog_links_and_docs_index():
    assert not missing("CHANGELOG.md", paths=False)
    readme = open(os.path.join(ROOT, "README.md")).read()
    unlinked = [d for d in DOCS[1:] if f"]({d})" not in readme]
    assert not unlinked, f"docs the README does not link: {unlinked}"
    assert 'python -m pytest -q -m "not slow"' in readme and "python -m launch.main --config=configs/stage.py" in readme
