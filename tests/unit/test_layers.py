"""Data flows one way, and so do imports: no module under mcsync/ imports from a layer above
its own, and no two modules import each other. The layers are the ones docs/ARCHITECTURE.md
draws; a new module is given its layer here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "mcsync"

# Lowest first. A module may import from its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    ("_version", "types", "errors", "tasks"),
    ("config", "retry", "limits", "ratelimit", "hashing", "checksums", "chunking", "delta",
     "report", "events", "stores.base", "stores.wrap"),
    ("streaming", "stores.s3_errors", "stores.s3_clients", "stores.s3_upload", "stores.s3_crt",
     "stores.obstore_body", "stores.s3_listing", "stores.s3",
     "stores.local_files", "stores.local", "stores.gcs", "stores.azure", "stores.memory",
     "stores.registry",
     "metrics", "resilience"),
    ("index", "manifest_schema", "manifest", "listing", "checkpoints", "plan", "spool", "lock",
     "delta_bases", "preflight"),
    ("scan", "compare", "verify", "delta_planner"),
    ("upload", "compose", "transfer", "manifest_copy", "dispatch"),
    ("driver", "engine", "watch"),
    ("__init__", "cli.main", "cli.run", "cli.plan_view", "cli.progress", "testing.processes",
     "testing.tls", "testing.servers", "testing.gcs", "testing.azurite", "testing.faults",
     "testing.s3_requests",
     "testing.faultproxy",
     "testing.synthetic"),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = rel.parts
        if parts[-1] == "__init__" and len(parts) > 1:
            continue  # package markers (cli/, stores/, testing/) hold no code of their own
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, *, typing: bool = True) -> set[str]:
    """The mcsync modules ``name`` imports; with ``typing`` False, only those imported when it
    runs (not under ``if TYPE_CHECKING:``)."""
    package = name.split(".")[:-1] if name != "__init__" else []
    found: set[str] = set()
    known = modules()
    tree = ast.parse(path.read_text())
    skipped = set() if typing else {
        id(inner) for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("mcsync"):
                target = node.module.removeprefix("mcsync").lstrip(".")
            else:
                continue
            for alias in node.names:  # "from .. import checksums" names a module
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mcsync."):
                    found.add(alias.name.removeprefix("mcsync."))
    found.discard(name)
    return {m for m in found if m in known or m == "__init__"}


def test_every_module_has_a_layer():
    assert sorted(set(modules()) - set(LAYER)) == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_imports_from_a_layer_above_its_own(name):
    path = modules()[name]
    above = sorted(m for m in imports_of(name, path) if LAYER[m] > LAYER[name])
    assert above == [], f"{name} (layer {LAYER[name]}) imports {above} from above"


def test_no_import_cycles():
    graph = {name: imports_of(name, path, typing=False) for name, path in modules().items()}
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
