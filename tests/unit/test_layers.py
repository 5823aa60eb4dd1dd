"""Data flows one way, and so do imports. The packages under mcsync/ are the layers
docs/ARCHITECTURE.md draws: a package imports only from packages below it, and the modules at
the top of mcsync/ are the leaves every layer may hold (records, errors, config, events ...),
which import no package. No two modules import each other. Nothing under mcsync/ imports
``testbed``, which the wheel does not ship."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "mcsync"

# Lowest first: a package may import from the leaves and from the packages of layers below its
# own, never from one beside it or above. ``__init__`` is the library's API (mcsync.sync).
LAYERS: list[tuple[str, ...]] = [
    ("stores",),
    ("checkpoints", "delta", "observe", "testing", "cache"),
    ("state",),
    ("move",),
    ("scale",),
    ("run",),
    ("__init__",),
    ("cli",),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]  # a package's own __init__ stands for the package
        found[".".join(parts)] = path
    return found


def unit(module: str) -> str:
    """The package a module is in, or the module itself at the top of mcsync/ (a leaf)."""
    return module.split(".")[0]


def is_leaf(name: str) -> bool:
    return name not in LAYER and not (PACKAGE / name).is_dir()


def imports_of(name: str, path: Path) -> set[str]:
    """The mcsync modules ``name`` imports, those under ``if TYPE_CHECKING:`` and inside
    functions included: an import only the type checker or one path follows is still a
    dependency between the two modules."""
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package and name != "__init__" else name.split(".")[:-1]
    found: set[str] = set()
    known = modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("mcsync"):
                target = node.module.removeprefix("mcsync").lstrip(".")
            else:
                continue
            for alias in node.names:  # "from . import checksums" names a module
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mcsync."):
                    found.add(alias.name.removeprefix("mcsync."))
    found.discard(name)
    return {m for m in found if m in known or m == "__init__"}


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(packages - set(LAYER)) == []


def test_the_top_holds_only_leaves_and_few_of_them():
    leaves = sorted(m for m in modules() if "." not in m and is_leaf(m))
    assert len(leaves) + 1 <= 20, leaves  # and __init__


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_import_reaches_up_or_sideways(name):
    here = unit(name)
    wrong = []
    for m in sorted(imports_of(name, modules()[name])):
        there = unit(m)
        if there == here or is_leaf(there):
            continue
        if is_leaf(here) or LAYER[there] >= LAYER[here]:
            wrong.append(m)
    assert wrong == [], f"{name} imports {wrong}: not from a layer below its own"


def test_the_package_never_imports_the_testbed():
    """testbed/ (local servers, the fault proxy) is not in the wheel: an import of it would
    fail for every user."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [name for n in names if n.split(".")[0] == "testbed"]
    assert found == []


def test_no_import_cycles():
    graph = {name: imports_of(name, path) for name, path in modules().items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 2:
            return
        assert state.get(node) != 1, "import cycle: " + " -> ".join([*trail, node])
        state[node] = 1
        for nxt in graph[node]:
            visit(nxt, [*trail, node])
        state[node] = 2

    for name in graph:
        visit(name, [])
