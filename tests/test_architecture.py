"""Imports point inward only: web and CLI -> client and worker -> store protocol -> core."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "conveyor"

# Layers from the inside out; a module may import only its own layer or layers inside it.
LAYERS = [
    ("core", lambda m: m.startswith("conveyor.core")),
    ("errors", lambda m: m == "conveyor.errors"),
    ("store", lambda m: m.startswith("conveyor.store")),
    (
        "runtime",
        lambda m: (
            m
            in {
                "conveyor._registry",
                "conveyor._resource",
                "conveyor._blocking",
                "conveyor._isolation",
                "conveyor.context",
                "conveyor.client",
                "conveyor.worker",
                "conveyor.maintenance",
            }
        ),
    ),
    (
        "shell",
        lambda m: (
            m in {"conveyor.cli", "conveyor.__main__", "conveyor"} or m.startswith("conveyor.web")
        ),
    ),
]

DRIVERS = {"sqlite3", "psycopg", "psycopg_pool", "asyncio", "fastapi", "starlette", "click"}


def _layer(module: str) -> int:
    for index, (_, test) in enumerate(LAYERS):
        if test(module):
            return index
    raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_imports_point_inward() -> None:
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        own = _layer(module)
        for imported in _imports(path):
            inside = imported.startswith("conveyor") and imported != "conveyor"
            if inside and _layer(imported) > own:
                wrong.append(f"{module} ({LAYERS[own][0]}) imports {imported}")
    assert not wrong, "imports that point outward:\n" + "\n".join(sorted(wrong))


def test_core_is_pure() -> None:
    impure = []
    for path in (PACKAGE / "core").rglob("*.py"):
        for imported in _imports(path):
            root = imported.split(".")[0]
            if root in DRIVERS or root in {"time", "random", "socket", "os.path"}:
                impure.append(f"{_module_name(path)} imports {imported}")
    # ids draw randomness from os.urandom by design; everything else is pure.
    assert impure == [], impure


def test_only_backends_import_database_drivers() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module.startswith("conveyor.store."):
            continue
        for imported in _imports(path):
            if imported.split(".")[0] in {"sqlite3", "psycopg", "psycopg_pool"}:
                offenders.append(f"{module} imports {imported}")
    assert offenders == [], offenders
