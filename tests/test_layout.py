"""The package's import graph: no circles, and the layers point one way.

Every ``import`` and ``from ... import`` of an hpcrl module inside hpcrl counts, at module level
and inside functions alike (a lazy import that closes a circle is still a circle: it only
moves the failure to run time). Importing ``a.b.c`` also imports the packages ``a`` and
``a.b``, except those the importing module already lives in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hpcrl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    """Every module of the package: its Python files and its C extensions (by their sources,
    which import nothing of hpcrl)."""
    return {module_name(p): p for pattern in ("*.py", "*.c") for p in PACKAGE.rglob(pattern)}


def ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The hpcrl modules that ``name`` imports (resolved to modules, not names in them)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:        # a name inside a module
                target = target.rpartition(".")[0]
            if target.startswith("hpcrl") and target != name:
                out.add(target)
                out.update(a for a in ancestors(target) if a not in ancestors(name) and a != name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imported_modules(name, path, modules) if path.suffix == ".py" else set()
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}                  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"b"}}) == ["b", "b"]


def test_imported_modules_resolves_names_submodules_and_parent_packages(tmp_path):
    modules = all_modules()
    graph = import_graph()
    # "from hpcrl.io import checkpoint" is the module hpcrl.io.checkpoint (and its package)
    assert "hpcrl.io.checkpoint" in graph["hpcrl.runtime.coord"]
    assert "hpcrl.io" in graph["hpcrl.runtime.coord"]
    # "from hpcrl.rl.losses import td_error" is the module, not a name
    assert "hpcrl.rl.losses" in graph["hpcrl.agents.async_rl.learner"]
    # lazy imports inside functions count
    assert "hpcrl.agents.async_rl.worker" in graph["hpcrl.agents"]
    assert set(graph) == set(modules)


def test_no_import_circle_inside_hpcrl():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("lower, upper", [
    ("hpcrl.runtime", "hpcrl.agents"),       # the runtime knows no algorithm
    ("hpcrl.rl", "hpcrl.agents"),            # the math knows no worker
    ("hpcrl.rl", "hpcrl.runtime.program"),
    ("hpcrl.io", "hpcrl.runtime"),
    ("hpcrl.envs", "hpcrl.rl"),
    ("hpcrl.agents", "hpcrl.bench"),         # no benchmark code in the algorithms
    ("hpcrl.runtime", "hpcrl.bench"),
    ("hpcrl.runtime", "hpcrl.run"),          # the runtime does not depend on the CLI
])
def test_layers_point_one_way(lower, upper):
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items()
                       if m == lower or m.startswith(lower + ".")
                       for t in targets if t == upper or t.startswith(upper + "."))
    assert not offenders, offenders
