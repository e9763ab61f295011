"""Imports point inward only: cli and web -> app -> worker -> observe -> store -> core."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "conveyor"

# Layers from the inside out, each a set of package prefixes; a module belongs to the layer
# of its longest matching prefix, and may import only its own layer or layers inside it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("conveyor.core",)),
    ("errors", ("conveyor.errors",)),
    ("store", ("conveyor.store",)),
    # What a process tells of its jobs: log formats, metrics, hooks, spans.
    ("observe", ("conveyor.observe",)),
    # The values application code holds and a worker runs: handles, the handler registry,
    # the sync adapter. They live with the application but sit below the worker, which
    # runs the handlers they describe.
    ("app values", ("conveyor.app.handles", "conveyor.app.registry", "conveyor.app.blocking")),
    ("worker", ("conveyor.worker",)),
    ("app", ("conveyor.app",)),
    # The REST API and the dashboard; the CLI serves them (`conveyor serve`), never the
    # other way round.
    ("web", ("conveyor.web",)),
    ("cli", ("conveyor.cli", "conveyor.__main__")),
    # The testing kit for applications' own tests, and its pytest plugin.
    ("testing", ("conveyor.testing", "conveyor._pytest_plugin")),
    # The package: its public names, and the old module paths it keeps working.
    ("package", ("conveyor", "conveyor._moved")),
    # Django's task backend: an application of the package's public names.
    ("django", ("conveyor.django",)),
]

# Imports that point outward on purpose, each run lazily inside one function.
LAZY_DOORS = {
    # JobHandle.accepted() answers HTTP for applications that serve it themselves.
    ("conveyor.app.handles", "conveyor.web"),
}

DRIVERS = {"sqlite3", "psycopg", "psycopg_pool", "asyncio", "fastapi", "starlette", "click"}


def _layer(module: str) -> int:
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # The package itself is a layer of one: `conveyor` prefixes every module.
            inside = prefix != "conveyor" and module.startswith(prefix + ".")
            if (module == prefix or inside) and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from conveyor.app import blocking` imports the module conveyor.app.blocking
            # (and runs the package's docstring-only __init__); a name that is no module
            # counts as an import of the module it comes from.
            modules = {f"{node.module}.{alias.name}" for alias in node.names} & _MODULES
            found.update(modules or {node.module})
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(path: Path) -> set[tuple[str, bool]]:
    """The conveyor modules ``path`` imports when it runs, each with whether the import is
    lazy (inside a function): module-level and lazy imports both count (a lazy import only
    postpones a cycle), those under ``if TYPE_CHECKING:`` do not."""
    found: set[tuple[str, bool]] = set()
    pending: list[tuple[ast.AST, bool]] = [(ast.parse(path.read_text()), False)]
    while pending:
        node, lazy = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend((child, lazy) for child in node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update((alias.name, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module, lazy))
            # `from conveyor.web import _schemas` imports the module conveyor.web._schemas.
            found.update((f"{node.module}.{alias.name}", lazy) for alias in node.names)
        inside = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        pending.extend((child, inside) for child in ast.iter_child_nodes(node))
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    return {(m, lazy) for m, lazy in found if m in modules}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the conveyor modules it imports at run time, packages included: importing
    ``conveyor.web._api`` runs ``conveyor/web/__init__.py`` first. The lazy doors are left
    out while they stay inside a function: each is one deliberate step outward, taken after
    both modules are loaded."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        edges: set[str] = set()
        for imported, lazy in _runtime_imports(path):
            if lazy and (module, imported) in LAZY_DOORS:
                continue
            parts = imported.split(".")
            edges.update(".".join(parts[:n]) for n in range(2, len(parts) + 1))
        graph[module] = edges - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: one path per strongly connected group (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _outward(imports: Mapping[str, Iterable[str]]) -> list[str]:
    """The imports of ``imports`` (module -> what it imports) that point outward."""
    wrong = []
    for module, imported_ones in imports.items():
        own = _layer(module)
        for imported in imported_ones:
            inside = imported.startswith("conveyor") and imported != "conveyor"
            if inside and _layer(imported) > own and (module, imported) not in LAZY_DOORS:
                wrong.append(f"{module} ({LAYERS[own][0]}) imports {imported}")
    return sorted(wrong)


def _all_imports() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def test_imports_point_inward() -> None:
    wrong = _outward(_all_imports())
    assert not wrong, "imports that point outward:\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_outward_import() -> None:
    # Deliberate breakages, as the architecture review made them in a clone.
    assert _outward({"conveyor.web._api": {"conveyor.cli"}}) == [
        "conveyor.web._api (web) imports conveyor.cli"
    ]
    assert _outward({"conveyor.worker.context": {"conveyor.app.client"}}) != []
    assert _outward({"conveyor.core.model": {"conveyor.store.protocol"}}) != []
    assert _outward({"conveyor.cli.jobs": {"conveyor.web._api", "conveyor.core.ids"}}) == []
    with pytest.raises(AssertionError, match="belongs to no layer"):
        _layer("conveyor.newthing")


# Where each database driver may be imported: inside its own backend package only, so
# that the shared store modules (the scripts, the reads, fairness, rows) stay dialect-free.
DRIVER_HOMES = {
    "sqlite3": "conveyor.store.sqlite.",
    "psycopg": "conveyor.store.postgres.",
    "psycopg_pool": "conveyor.store.postgres.",
}


def _driver_offenders(imports: Mapping[str, Iterable[str]]) -> list[str]:
    offenders = []
    for module, imported_ones in imports.items():
        for imported in imported_ones:
            home = DRIVER_HOMES.get(imported.split(".")[0])
            if home is not None and not module.startswith(home):
                offenders.append(f"{module} imports {imported}")
    return sorted(offenders)


def test_drivers_are_imported_only_in_their_backend() -> None:
    assert _driver_offenders(_all_imports()) == []


def test_the_driver_check_sees_a_driver_outside_its_backend() -> None:
    assert _driver_offenders({"conveyor.store.scripts.claim": {"sqlite3"}}) == [
        "conveyor.store.scripts.claim imports sqlite3"
    ]
    assert _driver_offenders({"conveyor.store.sqlite.backend": {"psycopg.errors"}}) != []
    assert _driver_offenders({"conveyor.store": {"psycopg_pool"}}) != []
    assert _driver_offenders({"conveyor.worker._worker": {"sqlite3"}}) != []
    assert _driver_offenders({"conveyor.store.postgres._codec": {"psycopg", "psycopg.sql"}}) == []


def test_core_imports_no_driver_and_no_clock() -> None:
    impure = []
    for path in (PACKAGE / "core").rglob("*.py"):
        for imported in _imports(path):
            root = imported.split(".")[0]
            if root in DRIVERS or root in {"time", "random", "socket"}:
                impure.append(f"{_module_name(path)} imports {imported}")
    assert impure == [], impure


# Reads of the clock, the process or the machine; the core takes such facts as arguments.
IMPURE_READS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "*"),
    ("os", "*"),
    ("random", "*"),
}

# The core's reads of the process, each with its reason.
CORE_READS_ALLOWED = {
    # A new id's random part; its time part is passed in (core/ids.py new_id(now)).
    ("conveyor.core.ids", "os.urandom"),
}


def _impure_reads(module: str, source: str) -> list[str]:
    """``name.attribute`` reads in ``source`` that consult the clock or the process."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name is None:
            continue
        read = f"{name}.{node.attr}"
        if ((name, node.attr) in IMPURE_READS or (name, "*") in IMPURE_READS) and (
            module,
            read,
        ) not in CORE_READS_ALLOWED:
            found.append(f"{module}: {read}")
    return sorted(found)


def test_core_reads_no_clock_and_no_process() -> None:
    found = []
    for path in (PACKAGE / "core").rglob("*.py"):
        found += _impure_reads(_module_name(path), path.read_text())
    assert found == [], found


def test_the_purity_check_sees_clock_and_process_reads() -> None:
    model = "conveyor.core.model"
    assert _impure_reads(model, "def f():\n    return datetime.now(UTC)\n") == [
        f"{model}: datetime.now"
    ]
    assert _impure_reads(model, "x = datetime.datetime.utcnow()") == [f"{model}: datetime.utcnow"]
    assert _impure_reads(model, "pid = os.getpid()") == [f"{model}: os.getpid"]
    assert _impure_reads(model, "home = os.environ['HOME']") == [f"{model}: os.environ"]
    assert _impure_reads(model, "t = time.time()") == [f"{model}: time.time"]
    assert _impure_reads(model, "b = os.urandom(10)") == [f"{model}: os.urandom"]
    assert _impure_reads("conveyor.core.ids", "b = os.urandom(10)") == []
    assert _impure_reads(model, "def f(now): return now.replace(tzinfo=UTC)") == []


def test_no_import_cycle() -> None:
    # A package may import its own submodules (conveyor/__init__ re-exports the API);
    # every other loop between conveyor's modules is a cycle.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in _import_graph().items()}
    assert _cycles(graph) == [], "import cycles among conveyor's modules"


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_cli_loads_no_web_framework() -> None:
    # A fresh interpreter: this test process has FastAPI loaded already.
    code = (
        "import sys, conveyor.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'fastapi', 'starlette', 'uvicorn'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    assert out.stdout.strip() == "[]", out.stdout


# What `conveyor --help` must not load: each costs tens to hundreds of milliseconds.
HEAVY_FOR_HELP = {
    "asyncio",
    "croniter",
    "fastapi",
    "httpx",
    "jinja2",
    "opentelemetry",
    "prometheus_client",
    "psycopg",
    "psycopg_pool",
    "pydantic",
    "rich",
    "sqlite3",
    "starlette",
    "uvicorn",
}


@pytest.mark.parametrize("argv", [["--help"], ["worker", "--help"], ["jobs", "list", "--help"]])
def test_help_loads_none_of_the_heavy_modules(argv: list[str]) -> None:
    # A fresh interpreter, as `conveyor --help` runs: the package and the CLI import
    # their heavy dependencies only in the commands that use them.
    code = (
        "import sys\n"
        "from conveyor.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))\n"
        "ours = sorted(m for m in sys.modules if m in "
        "('conveyor.app', 'conveyor.worker', 'conveyor.store', 'conveyor.cli._console'))\n"
        "print(loaded + ours, file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *sorted(HEAVY_FOR_HELP)],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    assert "Usage:" in out.stdout
    assert out.stderr.strip() == "[]", out.stderr


def test_the_package_loads_its_parts_when_first_used() -> None:
    code = (
        "import sys, conveyor\n"
        "before = 'conveyor.app.client' in sys.modules\n"
        "from conveyor import Conveyor, Status, WorkerOptions\n"
        "print(before, Conveyor.__module__, Status.__module__, WorkerOptions.__module__)\n"
        "try:\n"
        "    conveyor.Missing\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    assert out.stdout.splitlines() == [
        "False conveyor.app.client conveyor.core.lifecycle conveyor.worker.options",
        "module 'conveyor' has no attribute 'Missing'",
    ]


# Sizes are gated on what code does, not on its lines: statements (a docstring or a comment
# costs nothing, so no gate rewards deleting documentation) and public methods. Each
# allowance names its reason; an allowance nothing needs any more fails the test.
MAX_FUNCTION_STATEMENTS = 50
MAX_CLASS_STATEMENTS = 300
MAX_PUBLIC_METHODS = 30
MAX_MODULE_LINES = 800

ALLOWANCES = {
    # The application API, one facade by design (River's Client, Oban's top module); what
    # only operators' tools use lives in app.ops.
    "conveyor/app/client.py:Conveyor public methods",
}


def _statements(node: ast.AST) -> int:
    """Statements below ``node``, its docstring not counted."""
    count = sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        count -= isinstance(body[0].value.value, str)
    return count


def _oversized(name: str, source: str) -> list[str]:
    """What in module ``name`` is over a size gate, allowed or not."""
    over = []
    if len(source.splitlines()) > MAX_MODULE_LINES:
        over.append(f"{name} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _statements(node) > MAX_FUNCTION_STATEMENTS:
                over.append(f"{name}:{node.name} statements")
        elif isinstance(node, ast.ClassDef):
            if _statements(node) > MAX_CLASS_STATEMENTS:
                over.append(f"{name}:{node.name} statements")
            public = {
                m.name
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                and not m.name.startswith("_")
            }
            if len(public) > MAX_PUBLIC_METHODS:
                over.append(f"{name}:{node.name} public methods")
    return over


def test_sizes_follow_responsibilities() -> None:
    over = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        over.update(_oversized(str(path.relative_to(PACKAGE.parent)), path.read_text()))
    assert sorted(over - ALLOWANCES) == [], "split these by responsibility"
    assert sorted(ALLOWANCES - over) == [], "allowances no longer needed: remove them"


def test_the_size_gates_see_big_code_and_ignore_docs() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_STATEMENTS + 1))
    assert _oversized("m.py", f"def f():\n{body}") == ["m.py:f statements"]
    # Documentation is free: a long docstring and comments do not count.
    docs = '    """' + "A line of documentation.\n" * 900 + '    """\n' + "    # why\n" * 10
    assert _oversized("m.py", f"def f():\n{docs}    return 1\n") == ["m.py lines"]
    methods = "".join(f"    def m{i}(self): pass\n" for i in range(MAX_PUBLIC_METHODS + 1))
    assert _oversized("m.py", f"class C:\n{methods}") == ["m.py:C public methods"]
    private = "".join(f"    def _m{i}(self): pass\n" for i in range(MAX_PUBLIC_METHODS + 1))
    assert _oversized("m.py", f"class C:\n{private}") == []


def test_one_list_of_exports() -> None:
    # conveyor/__init__.py names its exports three times, for three readers: the lazy
    # table (run time), the TYPE_CHECKING imports (type checkers) and __all__ (star
    # imports, documentation). They must agree, name for name and module for module.
    import conveyor

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                assert isinstance(child, ast.ImportFrom) and child.module, ast.dump(child)
                typed.update((alias.name, child.module) for alias in child.names)
    assert typed == conveyor._EXPORTS
    assert sorted(conveyor.__all__) == sorted(conveyor._EXPORTS)
    for name, module in conveyor._EXPORTS.items():
        assert getattr(importlib.import_module(module), name) is getattr(conveyor, name), name


def test_old_import_paths_keep_working_or_name_the_new_one() -> None:
    import conveyor.observe.hooks
    from conveyor import _moved

    # An old path gives the module at its new one (type checkers know only the new one).
    for old, new in _moved.ALIASES.items():
        assert importlib.import_module(old) is importlib.import_module(new)
    from_old = subprocess.run(
        [sys.executable, "-c", "from conveyor.hooks import Hooks; print(Hooks.__module__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    assert from_old.stdout.strip() == conveyor.observe.hooks.__name__
    for old, new in _moved.MOVED.items():
        with pytest.raises(ModuleNotFoundError, match=f"{old} moved to {new}"):
            importlib.import_module(old)
    # Every path the docs or the README gave users (as `import x` or `from x import`).
    told = set()
    for page in [PACKAGE.parent / "README.md", *(PACKAGE.parent / "docs").glob("*.md")]:
        told.update(re.findall(r"(?:from|import) (conveyor[\w.]*)", page.read_text()))
    for module in sorted(told):
        importlib.import_module(module)


# Public methods whose return type is left unexported, each with its reason.
UNEXPORTED_RETURNS = {
    # An awaitable that is already done, so `ctx.progress(...)` works with or without await.
    "JobContext.progress",
    # The runs a worker holds are its internals; tests and tools read their `job`.
    "Worker.held",
}


APPLICATION_API = ("conveyor.app", "conveyor.worker", "conveyor.observe")


def test_every_type_a_public_method_returns_is_exported() -> None:
    import typing

    import conveyor

    missing = []
    for name in conveyor.__all__:
        cls = getattr(conveyor, name)
        # The application's API: the facade, its handles and services, the worker, a
        # handler's context, the hooks. (The store protocol's own types are the backends'.)
        if not isinstance(cls, type) or not cls.__module__.startswith(APPLICATION_API):
            continue
        for attribute, member in vars(cls).items():
            if attribute.startswith("_") or f"{name}.{attribute}" in UNEXPORTED_RETURNS:
                continue
            function = member.fget if isinstance(member, property) else member
            returns = getattr(function, "__annotations__", {}).get("return")
            if not isinstance(returns, str):
                continue
            for word in re.findall(r"[A-Za-z_]\w*", returns):
                if word[0].isupper() and word not in conveyor.__all__:
                    found = getattr(sys.modules[cls.__module__], word, None)
                    if isinstance(found, type) and found.__module__.startswith("conveyor"):
                        missing.append(f"{name}.{attribute} -> {word}")
    assert missing == [], missing
    assert typing.get_type_hints(conveyor.Conveyor.health)["return"] is conveyor.Health


def test_the_architecture_page_names_every_package() -> None:
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    packages = [p.parent.relative_to(PACKAGE.parent) for p in PACKAGE.rglob("*/__init__.py")]
    missing = [f"{p}/" for p in sorted(packages) if f"`{p}/`" not in page]
    assert missing == [], f"docs/architecture.md does not describe {missing}"
