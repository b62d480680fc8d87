"""The library's layout stays readable: small modules, and no import cycle (lazy imports included)."""

import ast
from pathlib import Path

import pytest

import lesson_lib

pytestmark = pytest.mark.ch0
ROOT = Path(lesson_lib.__file__).parent
MAX_LINES = 300  # the style guide's limit (picotron's), stated in CONTRIBUTING.md


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("lesson_lib", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The lesson_lib modules ``name`` imports anywhere in its file (in functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            subs = {f"{target}.{a.name}" for a in node.names} & modules.keys()
            found |= subs or {target}
    return {m for m in found if m in modules and m != name}


def test_no_module_is_longer_than_the_limit():
    # bug caught: a module growing back past what one reader can hold (runtime.py was 867 lines)
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_import_cycle_not_even_through_a_lazy_import():
    # bug caught: ch05 <-> ch05_exercises, ch06 <-> ch06_exercises, once broken by imports in functions
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert graph["lesson_lib.chapters.ch05"] >= {"lesson_lib.chapters.ch05_exercises"}  # the graph is real
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles
