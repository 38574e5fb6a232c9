"""The library's imports run one way: no module of `t2t_jax` imports itself back through others
(function-local imports count too), so the schema sits above the modules that own legal values
and the stage loop above its phases."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "t2t_jax")


def modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "t2t_jax." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[module.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the t2t_jax modules it imports (`from pkg import mod` names the module)."""
    mods = modules()

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.startswith("t2t_jax")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("t2t_jax"):
                deps |= {resolve(f"{node.module}.{a.name}") for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import (the library imports by absolute name)")
        graph[module] = deps - {None, module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_library_has_no_import_cycle():
    graph = import_graph()
    assert graph["t2t_jax.stages"] >= {"t2t_jax.rl.stage", "t2t_jax.rl.warm_start", "t2t_jax.evaluation.points"}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_below_the_schema_imports_it():
    users = sorted(m for m, deps in import_graph().items() if "t2t_jax.config.schema" in deps)
    assert set(users) <= {"t2t_jax.rundir", "t2t_jax.cli"}, users
