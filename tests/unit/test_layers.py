"""Data flows one way, and so do imports: no module under mcsync/ imports from a layer above
its own, and no two modules import each other. The layers are the ones docs/ARCHITECTURE.md
draws; a new module is given its layer here. And nothing under mcsync/ imports ``testbed``,
which the wheel does not ship."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "mcsync"

# Lowest first. A module may import from its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    ("_version", "types", "errors", "tasks"),
    ("config", "retry", "limits", "ratelimit", "hashing", "checksums", "chunking", "delta",
     "report", "events", "stores.base", "stores.wrap", "cache.space"),
    ("streaming", "stores.s3_errors", "stores.s3_body", "stores.s3_clients", "stores.s3_crt",
     "stores.s3_transport", "stores.s3_store_clients", "stores.s3_upload",
     "stores.obstore_body", "stores.s3_listing", "stores.s3",
     "stores.local_files", "stores.local_paths", "stores.local", "stores.gcs", "stores.azure",
     "stores.memory",
     "stores.registry", "stores.single",
     "metrics", "resilience", "cache.files"),
    ("index", "manifest_schema", "manifest", "task_log", "listing", "checkpoints", "latest",
     "shard", "plan", "spool", "lock", "delta_bases", "preflight", "cache.index", "cache.reader"),
    ("scan", "compare", "verify", "delta_planner", "status"),
    ("upload", "compose", "part_sender", "part_tasks", "transfer", "manifest_copy", "dispatch",
     "worker_runner", "cache.fill", "cache.room"),
    ("local_pool", "ray_pool", "workers", "driver", "engine", "watching", "cache.cache",
     "cache.warm"),
    ("__init__", "cli.main", "cli.run", "cli.plan_view", "cli.progress", "testing.faults",
     "cache.fs", "cli.cache_cmd", "cli.status_cmd"),
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


def imports_of(name: str, path: Path) -> set[str]:
    """The mcsync modules ``name`` imports, those under ``if TYPE_CHECKING:`` included: an
    import only the type checker follows is still a dependency between the two modules."""
    package = name.split(".")[:-1] if name != "__init__" else []
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
