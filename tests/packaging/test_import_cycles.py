"""Layering (issue 34): no import cycles in the Airflow-free core, between its subpackages or between
the files of one subpackage.

The graph is read from the source with ``ast``, not from ``sys.modules``: every ``import`` and
``from ... import`` counts wherever it is written, at the top of a file, inside a function (a lazy
import only hides a cycle from the interpreter) or under ``if TYPE_CHECKING:`` (a type is a
dependency too).  A top-level module (``conventions``, ``errors``, ``permissions``, ``cli``) counts as a
subpackage of its own.  A cycle is reported as the chain of modules with the file and line of each
import, e.g. ``training.cluster -> training.ledger -> training.cluster``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging.installs import REPO

PACKAGE = "trainops"

#: imports the cycle check leaves out, each with the reason; (importer, imported), module names
#: without the ``trainops.`` prefix.  Each must still exist (``test_every_known_exception_still_applies``).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("training.job", "training.spec"): (
        "type-only (TYPE_CHECKING) import naming build_job's argument, while TrainingSpec's trial build "
        "calls build_job; job.py was being edited by others during issue 34.3 and was left alone"
    ),
}


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (the folder of ``package``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(root: Path, package: str) -> list[Import]:
    """Every import from one module of ``package`` to another, at any depth of its file's syntax tree."""
    modules = modules_of(root, package)

    def known(name: str) -> str | None:
        """The module ``name`` loads: itself, or the nearest enclosing module (``a.b.Name`` -> ``a.b``)."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                # ``from a import b``: the submodule a.b when there is one, else a (b is a name in it)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                if (target == package or target.startswith(f"{package}.")) and (imported := known(target)):
                    if imported != name:
                        found.append(Import(name, imported, str(path.relative_to(root.parent)), node.lineno))
    return found


def unit(module: str, package: str = PACKAGE) -> str:
    """The subpackage (or top-level module) a module belongs to: ``trainops.training.job`` -> ``training``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == package else ""


def short(module: str, package: str = PACKAGE) -> str:
    return module.removeprefix(f"{package}.")


def cycles(edges: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """Every import that closes a cycle, as the shortest cycle through it, as a closed list of nodes
    (``[a, b, a]``), each cycle once (started at its least node).  Cycles are looked for only inside
    the strongly connected components (Tarjan's algorithm, iteratively)."""
    found = set()
    for component in _components(edges):
        for a in sorted(component):
            for b in sorted(edges.get(a, ())):
                if b in component:
                    cycle = [a, *_shortest_path(b, a, component, edges)]
                    at = cycle.index(min(cycle[:-1]))
                    found.add((*cycle[at:-1], *cycle[:at], cycle[at]))
    return [list(cycle) for cycle in sorted(found, key=lambda c: (len(c), c))]


def _components(edges: Mapping[str, Iterable[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(set(edges) | {b for targets in edges.values() for b in targets}):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while (member := stack.pop()) != node:
                    on_stack.discard(member)
                    component.add(member)
                on_stack.discard(node)
                component.add(node)
                if len(component) > 1:
                    components.append(component)
    return components


def _shortest_path(start: str, end: str, within: set[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """``[start, ..., end]`` by breadth-first search over ``within``."""
    came_from = {start: start}
    frontier = [start]
    while end not in came_from:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child in within and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        assert following, f"no path from {start} to {end}"
        frontier = following
    path = [end]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def describe(cycle: list[str], edges: Mapping[str, Mapping[str, Import]], name=short) -> str:
    """``a -> b -> a``, then each step's import (file:line)."""
    steps = [edges[a][b] for a, b in zip(cycle, cycle[1:], strict=False)]
    where = "; ".join(f"{name(s.importer)} -> {name(s.imported)} at {s.path}:{s.line}" for s in steps)
    return f"{' -> '.join(map(name, cycle))}  ({where})"


def graphs(
    found: Iterable[Import], package: str = PACKAGE, exceptions: Iterable[tuple[str, str]] = ()
) -> tuple[dict[str, dict[str, Import]], dict[str, dict[str, dict[str, Import]]]]:
    """The subpackage graph (``training -> capacity``, its first import as the witness) and, per
    subpackage, the graph of its files; ``exceptions`` (short names) are left out of both."""
    skip = set(exceptions)
    between: dict[str, dict[str, Import]] = defaultdict(dict)
    within: dict[str, dict[str, dict[str, Import]]] = defaultdict(lambda: defaultdict(dict))
    for edge in found:
        if (short(edge.importer, package), short(edge.imported, package)) in skip:
            continue
        a, b = unit(edge.importer, package), unit(edge.imported, package)
        if not a or not b:
            continue  # the package's own __init__ belongs to no subpackage
        if a != b:
            between[a].setdefault(b, Import(a, b, edge.path, edge.line))
        else:
            within[a][edge.importer].setdefault(edge.imported, edge)
    return between, within


@pytest.fixture(scope="module")
def core_imports() -> list[Import]:
    return imports_of(REPO / PACKAGE, PACKAGE)


def test_no_cycle_between_core_subpackages(core_imports: list[Import]) -> None:
    between, _ = graphs(core_imports, exceptions=KNOWN_EXCEPTIONS)
    found = [describe(cycle, between, name=str) for cycle in cycles(between)]
    assert found == [], "import cycles between trainops subpackages:\n" + "\n".join(found)


def test_no_cycle_between_the_files_of_a_subpackage(core_imports: list[Import]) -> None:
    _, within = graphs(core_imports, exceptions=KNOWN_EXCEPTIONS)
    found = [describe(cycle, graph) for _, graph in sorted(within.items()) for cycle in cycles(graph)]
    assert found == [], "import cycles inside a trainops subpackage:\n" + "\n".join(found)


def test_every_known_exception_still_applies(core_imports: list[Import]) -> None:
    present = {(short(edge.importer), short(edge.imported)) for edge in core_imports}
    stale = sorted(set(KNOWN_EXCEPTIONS) - present)
    assert stale == [], f"these imports are gone: remove them from KNOWN_EXCEPTIONS: {stale}"


def test_lazy_and_type_only_imports_count(tmp_path: Path) -> None:
    """The check sees what the interpreter does not: imports inside functions and under TYPE_CHECKING,
    relative imports, and ``from package import submodule``."""
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/one.py": "from pkg.a import two\n",
        "a/two.py": "def later():\n    from .one import x\n",
        "b/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a.one\n",
        "b/three.py": "",
        "c.py": "def later():\n    from pkg.b.three import y\n",
        "a/four.py": "def later():\n    from pkg import c\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)

    between, within = graphs(imports_of(root, "pkg"), package="pkg")
    assert set(between) == {"a", "b", "c"} and set(between["a"]) == {"c"} and set(between["c"]) == {"b"}
    assert [describe(c, within["a"], name=lambda m: m.removeprefix("pkg.")) for c in cycles(within["a"])] == [
        "a.one -> a.two -> a.one  (a.one -> a.two at pkg/a/one.py:1; a.two -> a.one at pkg/a/two.py:2)"
    ]
    assert cycles(between) == [["a", "c", "b", "a"]]
