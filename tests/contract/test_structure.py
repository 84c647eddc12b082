"""The shape of the code base, checked by cohesion rules anyone can re-run.

- **No import cycles** among the product's modules (``party_a``, ``party_b``, ``shared``,
  ``api_schemas``) and the experiments: every import counts, a lazy one inside a function too,
  and a package's ``__init__`` is a module like any other.
- **No private cross-imports**: no module imports another module's ``_name``; a ``_module``
  is imported only from inside its own package (``shared.pq._kernels`` by ``shared.pq.*``).
- **Parties use shared's public faces**: ``party_a`` and ``party_b`` never import
  ``shared.wire`` (``shared.codec`` is the one face for bytes) nor any private module.
- **Who may import whom**: ``party_a`` and ``party_b`` never import each other; ``shared``
  imports neither party nor a web or database library; ``api_schemas`` imports nothing of
  ours but ``shared.types``; no product package imports the experiments, benchmarks, load
  tests or tests.
- Models are named in one place: outside ``shared/models/__init__.py`` (the registry) no code
  compares against a model's name or keys a table by it.
- Functions over 60 lines are reported as warnings (a prompt to look, not a bar).
"""

import ast
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.models import MODEL_NAMES

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("party_a", "party_b", "shared", "api_schemas")
GRAPHED = (*PRODUCT, "experiments")
OURS = {*PRODUCT, "experiments", "benchmarks", "loadtests", "tests", "examples"}
WEB_AND_DATABASE = {"fastapi", "starlette", "uvicorn", "httpx", "sqlalchemy"}

FORBIDDEN: dict[str, set[str]] = {
    "party_a": {"party_b"} | (OURS - set(PRODUCT)),
    "party_b": {"party_a"} | (OURS - set(PRODUCT)),
    "shared": {"party_a", "party_b", "api_schemas"} | (OURS - set(PRODUCT)) | WEB_AND_DATABASE,
    "api_schemas": OURS - {"api_schemas", "shared"},
}

MAX_FUNCTION_LINES = 60


class LongFunction(UserWarning):
    """A function over MAX_FUNCTION_LINES: worth a look, not a failure."""


@dataclass(frozen=True)
class Import:
    """One imported name: ``module`` (absolute, dotted) and ``name`` (None for ``import m``)."""

    module: str
    name: str | None
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def imports_of(source: str, module: str, *, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (inside functions too), relative ones made absolute."""
    found = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found += [Import(target, alias.name, node.lineno) for alias in node.names]
    return found


def _all_imports(*packages: str) -> dict[str, list[Import]]:
    return {
        module_name(path): imports_of(
            path.read_text(), module_name(path), is_package=path.name == "__init__.py"
        )
        for path in _modules(*packages)
    }


def _graph(imports: dict[str, list[Import]]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (``from pkg import mod`` names ``pkg.mod``)."""
    modules = set(imports)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, found in imports.items():
        for imp in found:
            submodule = f"{imp.module}.{imp.name}" if imp.name else None
            target = submodule if submodule in modules else imp.module
            if target in modules and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def private_cross_imports(imports: dict[str, list[Import]]) -> list[str]:
    """``module:line imported`` for each ``_name`` taken from another module, and each
    ``_module`` imported from outside its own package."""
    wrong = []
    for module, found in imports.items():
        for imp in found:
            parts = imp.module.split(".")
            if imp.name and imp.name.startswith("_") and not imp.name.startswith("__"):
                if f"{imp.module}.{imp.name}" in imports:  # a private submodule
                    parts = [*parts, imp.name]
                else:
                    wrong.append(f"{module}:{imp.line} {imp.module}.{imp.name}")
                    continue
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    package = ".".join(parts[:i])
                    if not (module == package or module.startswith(package + ".")):
                        wrong.append(f"{module}:{imp.line} {'.'.join(parts)}")
                    break
    return wrong


def test_the_checks_can_fail() -> None:
    source = (
        "import httpx.x\nfrom party_b import y\ndef f():\n    import sqlalchemy\nfrom . import z"
    )
    assert {i.module for i in imports_of(source, "shared.a")} == {
        "httpx.x",
        "party_b",
        "sqlalchemy",
        "shared",
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    imports = {
        "x.y": [Import("x.z", "_helper", 1), Import("x.p._k", None, 2)],
        "x.z": [],
        "x.p.q": [Import("x.p._k", "f", 3)],
        "x.p._k": [],
    }
    assert private_cross_imports(imports) == ["x.y:1 x.z._helper", "x.y:2 x.p._k"]


def test_no_import_cycles() -> None:
    assert cycles(_graph(_all_imports(*GRAPHED))) == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_cross_imports(_all_imports(*PRODUCT, "experiments", "benchmarks")) == []


@pytest.mark.parametrize("package", ["party_a", "party_b"])
def test_parties_use_shareds_public_faces(package: str) -> None:
    wrong = [
        f"{module}:{imp.line} {imp.module}"
        for module, found in _all_imports(package).items()
        for imp in found
        if imp.module == "shared.wire"
        or imp.module.startswith("shared.wire.")
        or (imp.module == "shared" and imp.name == "wire")
    ]
    assert wrong == [], "parties read and write bytes through shared.codec only"


@pytest.mark.parametrize("package", PRODUCT)
def test_packages_import_only_what_they_may(package: str) -> None:
    wrong = {
        module: sorted(names)
        for module, found in _all_imports(package).items()
        if (names := {i.module.split(".")[0] for i in found} & FORBIDDEN[package])
        and not (package == "api_schemas" and names == {"shared"} and _only_types(found))
    }
    assert wrong == {}


def _only_types(found: list[Import]) -> bool:
    return all(i.module == "shared.types" for i in found if i.module.startswith("shared"))


def test_long_functions_are_reported() -> None:
    for path in _modules(*PRODUCT):
        name = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    warnings.warn(
                        f"{name}::{node.name} has {lines} lines, a long function",
                        LongFunction,
                        stacklevel=1,
                    )


def _model_name_uses(source: str) -> list[int]:
    """Lines that compare against a model name or key a dict or set by one."""
    names = set(MODEL_NAMES)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            values = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Set):
            values = list(node.elts)
        else:
            continue
        if any(isinstance(v, ast.Constant) and v.value in names for v in values):
            found.append(node.lineno)
    return found


def test_models_are_looked_up_in_the_registry_only() -> None:
    assert _model_name_uses('if model == "tabular_mlp": pass') == [1]  # the check can fail
    tables = {
        str(path.relative_to(ROOT)): lines
        for path in _modules("party_a", "party_b", "shared")
        if path != ROOT / "shared" / "models" / "__init__.py"
        if (lines := _model_name_uses(path.read_text()))
    }
    assert tables == {}, "add what a model needs to its entry in shared.models._SPECS"
