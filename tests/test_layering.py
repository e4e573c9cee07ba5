"""The house's layering, read from the code's imports (top-level and inside functions alike):

    service -> worker -> storage -> conduit_core

A layer imports only the layers below it; no product module imports the lab (`lab/`, its
own distribution) or the tests; conduit_core imports only torch, transformers, tokenizers,
PIL, numpy, safetensors and the standard library (no web, queue, storage or PDF code); the
product's modules import each other without circles; routers import no other router. The lab
may import the product but never the tests (the tests may import the lab), and its modules
import each other without circles, counting imports inside functions too.

The service calls the worker through one module, `worker.facade`, and builds it from
`worker.settings`; it imports no other worker module.

The product carries only what it serves: every product module is reached from an entry point
by imports, and every public top-level function and class, public method and dataclass field
is named by product code (a module, function, method or field that only the lab or the tests
use lives in the lab or the tests)."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections import Counter
from pathlib import Path

import conduit_core

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["conduit_core", "storage", "worker", "service"]  # bottom to top
OUTSIDE = {"lab", "tests"}
CORE_ALLOWED = {"torch", "transformers", "tokenizers", "PIL", "numpy", "safetensors",
                "conduit_core"}


def _modules(layer: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of one layer."""
    root = ROOT / layer
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (`from a.b import c` gives a.b and a.b.c)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # top level: the module's statements and those of its `if` blocks (a TYPE_CHECKING import
    # closes a loop for the type checker as much as any)
    nodes = ([*tree.body, *(n for s in tree.body if isinstance(s, ast.If)
                            for n in [*s.body, *s.orelse])]
             if top_level_only else ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


PRODUCT = {name: path for layer in LAYERS for name, path in _modules(layer).items()}
LAB = _modules("lab")


def _circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among `edges` (module -> modules it imports), or None. A package's
    module importing the package itself (its face) is not a circle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if node.startswith(nxt + "."):  # its own package's face, whichever way it is met
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                loop = visit(nxt, [*path, nxt])
                if loop:
                    return loop
        state[node] = 2
        return None

    for name in sorted(edges):
        if name not in state:
            loop = visit(name, [name])
            if loop:
                return loop
    return None


def test_every_layer_imports_only_the_layers_below_it() -> None:
    assert len(PRODUCT) > 100
    for name, path in PRODUCT.items():
        rank = LAYERS.index(name.split(".")[0])
        for imported in _imports(path):
            top = imported.split(".")[0]
            assert top not in OUTSIDE, f"{name} imports {imported}: the product never imports " \
                "the lab or the tests"
            if top in LAYERS:
                assert LAYERS.index(top) <= rank, f"{name} imports {imported}: up a layer"


def test_conduit_core_imports_only_allowed_packages() -> None:
    for name, path in PRODUCT.items():
        if name.split(".")[0] != "conduit_core":
            continue
        bad = {m.split(".")[0] for m in _imports(path)} - CORE_ALLOWED
        bad = {m for m in bad if m not in sys.stdlib_module_names}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_no_import_circles_between_product_modules() -> None:
    """Module-level imports form no loop (a module's import of another runs at its import)."""
    edges = {name: {m for m in _imports(path, top_level_only=True) if m in PRODUCT} - {name}
             for name, path in PRODUCT.items()}
    loop = _circle(edges)
    assert loop is None, "import circle: " + " -> ".join(loop or [])


# conduit_core's floors, bottom to top: a folder imports only from itself and the floors below
# it. A floor holds one folder, or modules at conduit_core's top: those named on the ground
# floor, and every other one on the top floor, beside the runtime.
CORE_FLOORS: list[tuple[str, ...]] = [
    ("errors", "page_kv"),  # the error tree; page KV, the seam to storage
    ("model",),  # loading a VLM, its family adapters, the FLOPs of its shapes
    ("prompt",),  # token layout and positions, re-rotation of cached keys
    ("kv",),  # the runtime's caches, the decode pool, page KV loaded into a cache
    ("passes",),  # forwards over rows: page prefill, head, scoring, refresh, decode step
    ("policies",),  # which rows to refresh, and a policy as a request carries it
    ("cost",),  # FLOPs predicted before a policy runs
]


def _core_unit(module: str) -> str:
    """The folder (or top-level module) of conduit_core a module belongs to ("" = the face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _core_floor(module: str) -> int:
    unit = _core_unit(module)
    floors = [i for i, units in enumerate(CORE_FLOORS) if unit in units]
    return floors[0] if floors else len(CORE_FLOORS)


CORE = {name: path for name, path in PRODUCT.items() if name.split(".")[0] == "conduit_core"}


def test_conduit_core_folders_import_only_the_floors_below() -> None:
    """Every import counts, inside functions and under TYPE_CHECKING too."""
    assert {_core_unit(n) for n in CORE} >= {u for units in CORE_FLOORS for u in units}
    for name, path in CORE.items():
        for imported in _imports(path):
            if imported not in CORE:
                continue
            assert _core_floor(imported) <= _core_floor(name), \
                f"{name} imports {imported}: up a floor of conduit_core (tests/test_layering.py," \
                " CORE_FLOORS)"


def test_no_import_circles_between_conduit_core_modules() -> None:
    """No loop among conduit_core's modules, imports inside functions included."""
    edges = {name: {m for m in _imports(path) if m in CORE} - {name}
             for name, path in CORE.items()}
    loop = _circle(edges)
    assert loop is None, "import circle: " + " -> ".join(loop or [])


def test_the_lab_imports_no_tests() -> None:
    """Helpers the lab and the tests share live in the lab (or the product), never in tests."""
    assert len(LAB) > 50
    for name, path in LAB.items():
        bad = sorted(m for m in _imports(path) if m.split(".")[0] == "tests")
        assert not bad, f"{name} imports {bad}: the lab never imports the tests"


def test_no_import_circles_between_lab_modules() -> None:
    """No loop among the lab's modules, imports inside functions included (a lazy import
    that closes a loop is a loop all the same)."""
    edges = {name: {m for m in _imports(path) if m in LAB} - {name}
             for name, path in LAB.items()}
    loop = _circle(edges)
    assert loop is None, "import circle: " + " -> ".join(loop or [])


# The worker modules the service may import: the facade it calls, the settings it reads
SERVICE_SEAMS = ("worker.facade", "worker.settings")


def test_the_service_imports_only_the_workers_facade() -> None:
    service = {n: p for n, p in PRODUCT.items() if n.split(".")[0] == "service"}
    assert len(service) >= 10
    for name, path in service.items():
        deep = sorted(m for m in _imports(path) if m.split(".")[0] == "worker"
                      and not any(m == s or m.startswith(s + ".") for s in SERVICE_SEAMS))
        assert not deep, f"{name} imports {deep}: the service calls the worker through " \
            "worker.facade (add what it needs there)"


def test_routers_do_not_import_routers() -> None:
    routers = {n: p for n, p in PRODUCT.items() if n.startswith("service.routers.")}
    assert len(routers) >= 5
    for name, path in routers.items():
        others = {m for m in _imports(path) if m.startswith("service.routers")}
        assert not others, f"{name} imports {sorted(others)}: shared helpers live outside " \
            "the routers (service/access.py, service/answers.py)"


def test_public_api_reexports_resolve() -> None:
    assert sorted(conduit_core.__all__) == sorted(conduit_core._EXPORTS)
    for name in conduit_core.__all__:
        assert getattr(conduit_core, name).__name__ == name


# Where the product starts: module -> why. The policy registry and the model adapters import
# their modules in code (no lookup by a string), and the lazy faces of conduit_core and
# conduit_core.policies name their sources in TYPE_CHECKING imports, so imports find them all.
ENTRY_POINTS = {
    "service.cli": "the `conduit` console script (pyproject.toml [project.scripts]): `conduit "
                   "serve` builds the FastAPI app, `conduit worker` runs the Celery app",
}
# Modules a process loads by a name in a string: module -> (the module holding the string, why)
LOADED_BY_NAME = {
    "worker.ingest.reader_child": ("worker.ingest.sandbox", "the PDF reader process runs as "
                                   "`python -c 'from worker.ingest.reader_child import main'`"),
    "worker.ingest.office_child": ("worker.ingest.office", "the LibreOffice process starts as "
                                   "`python -c 'from worker.ingest.office_child import main'`"),
}
# Public functions and classes no product code names, kept on purpose: name -> why
UNNAMED_BY_DESIGN = {
    "conduit_core.policies.registry.register_policy": "the lab's way in: ablations and "
    "candidates register themselves from the lab, not from the product registry",
}
_REFERENCE = "the family's inputs to the transformers model's own forward, the reference every " \
    "pass is held to (tests, lab/gpu): it lives with the adapter that knows how its family " \
    "takes images"
# Public methods and dataclass fields no product code names, kept on purpose: name -> why
MEMBERS_UNNAMED_BY_DESIGN = {
    "conduit_core.model.adapters.base.VLMAdapter.reference_inputs": _REFERENCE,
    "conduit_core.model.adapters.internvl.InternVLAdapter.reference_inputs": _REFERENCE,
    "conduit_core.model.adapters.llava_onevision.LlavaOnevisionAdapter.reference_inputs":
        _REFERENCE,
    "conduit_core.model.adapters.qwen2_vl.Qwen2VLAdapter.reference_inputs": _REFERENCE,
}
# Methods a library calls by their name, never counted: name -> who calls it
CALLED_BY_A_LIBRARY = {
    "settings_customise_sources": "pydantic-settings, to order a settings class's sources",
}


def _is_face(name: str) -> bool:
    return PRODUCT[name].name == "__init__.py"


def _with_packages(name: str) -> set[str]:
    """`name` and the packages above it (importing a module runs their faces)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & PRODUCT.keys()


def _face_sources(face: str) -> dict[str, str]:
    """Names a package face imports from product modules -> the module each comes from."""
    tree = ast.parse(PRODUCT[face].read_text())
    return {alias.asname or alias.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in PRODUCT
            for alias in node.names}


def _uses(name: str) -> set[str]:
    """Product modules `name` uses: those it imports, with their packages; a name imported
    through a package face counts for the module it comes from. A face's own re-exports of
    its package's modules count only through an importer that asks for them."""
    out: set[str] = set()
    for imported in _imports(PRODUCT[name]):
        if imported in PRODUCT:
            out |= _with_packages(imported)
            continue
        parent, _, attr = imported.rpartition(".")
        if parent in PRODUCT:
            out |= _with_packages(parent)
            source = _face_sources(parent).get(attr) if _is_face(parent) else None
            out |= _with_packages(source) if source else set()
    if _is_face(name):
        out = {m for m in out if not m.startswith(name + ".")}
    return out - {name}


def test_the_entry_points_are_the_real_ones() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {target.split(":")[0] for target in scripts.values()} == set(ENTRY_POINTS)
    for module, (loader, why) in LOADED_BY_NAME.items():
        strings = {n.value for n in ast.walk(ast.parse(PRODUCT[loader].read_text()))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert any(module in s for s in strings), f"{loader} no longer loads {module} ({why})"


def test_every_product_module_is_reached_from_an_entry_point() -> None:
    """A module reached only from the lab or the tests belongs there (or nowhere)."""
    reached: set[str] = set()
    todo = [*ENTRY_POINTS, *LOADED_BY_NAME]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += _uses(name)
    unreached = sorted(set(PRODUCT) - reached)
    assert not unreached, f"product modules no entry point reaches: {unreached}"


def _named(path: Path, *, members: bool = False) -> Counter[str]:
    """Names a file's code uses: names, attributes, names imported from a module (not a
    face's re-exports) and identifier strings (a getattr by name), less `__all__`. With
    `members`, also keyword arguments (a field set by name), and a class's own field
    declarations do not count."""
    tree = ast.parse(path.read_text())
    skip = {id(node) for stmt in ast.walk(tree) if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
            for node in ast.walk(stmt.value)}
    if members:
        skip |= {id(stmt.target) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                 for stmt in cls.body if isinstance(stmt, ast.AnnAssign)}
    face = path.name == "__init__.py"
    out: Counter[str] = Counter()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name):
            out[node.id] += 1
        elif isinstance(node, ast.Attribute):
            out[node.attr] += 1
        elif isinstance(node, ast.ImportFrom) and not face:
            out.update(alias.name for alias in node.names)
        elif members and isinstance(node, ast.keyword) and node.arg:
            out[node.arg] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.isidentifier():
            out[node.value] += 1
    return out


def test_every_public_function_and_class_is_named_by_product_code() -> None:
    """A public top-level function or class that only the lab or the tests name belongs there
    (decorated ones are registered by their decorator: routes, tasks)."""
    named: Counter[str] = Counter()
    for path in PRODUCT.values():
        named += _named(path)
    unnamed = sorted(
        f"{module}.{node.name}" for module, path in PRODUCT.items()
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_") and not node.decorator_list
        and not named[node.name])
    assert set(UNNAMED_BY_DESIGN) <= set(unnamed), "kept on purpose, yet named now: " \
        f"{sorted(set(UNNAMED_BY_DESIGN) - set(unnamed))}"
    extra = sorted(set(unnamed) - set(UNNAMED_BY_DESIGN))
    assert not extra, f"only the lab or the tests use: {extra}"


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "dataclass"
               or isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
               and d.func.id == "dataclass" for d in cls.decorator_list)


def _members(cls: ast.ClassDef) -> list[str]:
    """A class's public methods (not those a decorator registers: validators and the like)
    and, for a dataclass, its public fields."""
    out = [node.name for node in cls.body
           if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
           and not node.name.startswith("_") and node.name not in CALLED_BY_A_LIBRARY
           and not any(isinstance(d, ast.Call) for d in node.decorator_list)]
    if _is_dataclass(cls):
        out += [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name) and not node.target.id.startswith("_")
                and "ClassVar" not in ast.unparse(node.annotation)]
    return out


def test_every_public_method_and_field_is_named_by_product_code() -> None:
    """A public method, or a dataclass's public field, that only the lab or the tests name
    belongs there (a test helper, a lab subclass) or is kept on purpose, with a reason."""
    named: Counter[str] = Counter()
    for path in PRODUCT.values():
        named += _named(path, members=True)
    unnamed = sorted(
        f"{module}.{cls.name}.{member}" for module, path in PRODUCT.items()
        for cls in ast.parse(path.read_text()).body if isinstance(cls, ast.ClassDef)
        for member in _members(cls) if not named[member])
    assert set(MEMBERS_UNNAMED_BY_DESIGN) <= set(unnamed), "kept on purpose, yet named now: " \
        f"{sorted(set(MEMBERS_UNNAMED_BY_DESIGN) - set(unnamed))}"
    extra = sorted(set(unnamed) - set(MEMBERS_UNNAMED_BY_DESIGN))
    assert not extra, f"only the lab or the tests use: {extra}"
