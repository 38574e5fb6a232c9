"""The notebooks run top to bottom (nbclient, a fresh kernel each, from the repository root; in
the slow set, which CI runs) and are committed with their outputs stripped."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(n for n in os.listdir(os.path.join(ROOT, "notebooks")) if n.endswith(".ipynb"))


def test_the_four_tours_are_there():
    assert NOTEBOOKS == ["environment_tour.ipynb", "grpo_stage.ipynb", "model_tour.ipynb", "study_results.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stripped(name):
    book = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), f"{name}: outputs committed"


@pytest.mark.slow  # (about 3 minutes for the four; CI runs the slow set)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
    book = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    env = {"JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # (the kernel inherits this process's environment)
    try:
        NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    images = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images or name == "model_tour.ipynb", f"{name}: no picture came out"
