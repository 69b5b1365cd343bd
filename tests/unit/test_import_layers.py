"""Imports point one way (docs/architecture.md, 'Rooms and layers'): each module imports only from its own
layer or the layers below.

Layers, lowest first. Lazy imports inside functions count too: a wrong-way import that is only deferred
still ties the lower room to the upper one. `eventing/__init__.py` (the public facade, imported lazily by
name) is the one exception.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, ...]] = [
    ("sharding",),
    ("metadata",),
    ("eventing.errors", "eventing.handler", "eventing.core"),
    ("eventing.storage",),
    ("eventing.security",),
    ("eventing.windows.semantics", "eventing.windows.batches"),
    ("eventing.windows.runtime", "eventing.windows.spark"),
    ("eventing.execution",),
    ("eventing.workers",),
    ("eventing.control",),
    ("eventing.ops",),
    ("eventing.api",),
    ("eventing.cli", "eventing.http", "eventing.kv", "eventing.testing", "eventing.__main__"),
]
HANDLERS = ("functions", "examples")  # user handlers: the handler API only


def layer_of(module: str) -> int | None:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "eventing":  # `from eventing import x`: the facade's names, or a submodule
                out.extend((node.lineno, f"eventing.{alias.name}") for alias in node.names)
            else:
                out.append((node.lineno, node.module))
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once a process: the checks below read the same ~300 files (read only:
    nothing changes a tree)."""
    return ast.parse(path.read_text(), str(path))


def project_files() -> list[Path]:
    files = [p for top in ("sharding", "metadata", "eventing", *HANDLERS) for p in (ROOT / top).rglob("*.py")]
    # The facade and empty package markers (eventing/windows/__init__.py) belong to no layer.
    return sorted(p for p in files if p != ROOT / "eventing" / "__init__.py" and p.read_text().strip())


def wrong_way_imports() -> list[str]:
    problems: list[str] = []
    for path in project_files():
        name = module_name(path)
        tree = parsed(path)
        if name.split(".")[0] in HANDLERS:
            for line, target in imported_modules(tree):
                if (
                    target.split(".")[0] in ("eventing", "metadata", "sharding")
                    and target != "eventing.handler"
                ):
                    problems.append(
                        f"{path.relative_to(ROOT)}:{line} imports {target} (handlers use eventing.handler)"
                    )
            continue
        own = layer_of(name)
        assert own is not None, f"{name} is in no layer; add it to LAYERS"
        for line, target in imported_modules(tree):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {target} from a higher layer")
    return problems


def test_every_import_points_down_the_layers():
    assert wrong_way_imports() == []


def test_the_check_sees_a_wrong_way_import(tmp_path, monkeypatch):
    tree = ast.parse("from eventing.workers.worker import WorkerCore\n")
    assert layer_of("eventing.storage.bucket") < layer_of(imported_modules(tree)[0][1])


@pytest.mark.parametrize("top", ["sharding", "metadata"])
def test_sharding_and_metadata_never_import_ray_or_spark(top):
    for path in (ROOT / top).rglob("*.py"):
        for _, target in imported_modules(parsed(path)):
            assert target.split(".")[0] not in ("ray", "pyspark"), f"{path} imports {target}"


def runtime_imports(tree: ast.AST) -> list[str]:
    """The modules a file imports when it runs: those under `if TYPE_CHECKING:` (for annotations only) left
    out."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    kept = ast.Module(body=[], type_ignores=[])
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` imports the submodule, not the package's other modules
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    ROOT / sub.replace(".", "/") / "__init__.py"
                ).exists()
                out.append(sub if is_module else node.module)
            continue
        kept.body = [node]
        out.extend(target for _, target in imported_modules(kept))
    return out


def import_cycles() -> list[list[str]]:
    """Groups of modules that import each other, directly or round a circle (imports inside functions
    count: deferring an import hides a circle, it does not remove it)."""
    files = project_files()
    names = {module_name(p) for p in files}

    def owner(target: str) -> str | None:
        while target and target not in names:
            target = target.rpartition(".")[0]
        return target or None

    graph = {
        module_name(p): {o for t in runtime_imports(parsed(p)) if (o := owner(t)) and o != module_name(p)}
        for p in files
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_itself_round_a_circle():
    assert import_cycles() == []


def test_the_cycle_check_sees_a_circle():
    tree = ast.parse(
        "def f():\n    from eventing.workers.worker import WorkerCore\nif TYPE_CHECKING:\n    import x.y\n"
    )
    assert runtime_imports(tree) == ["eventing.workers.worker"]
