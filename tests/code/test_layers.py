"""The layers of the code stay clean: every package has a layer and imports only its own or
lower ones, there is no import circle, and no module reaches into another package's private
names or hooks. Checked on the source, every import counted: at the top of a module or inside a
function, under ``if TYPE_CHECKING:``, relative (``from .x import y``), ``from hubless import X``
(resolved through the lazy ``_EXPORTS`` of ``hubless/__init__.py`` to the module that defines X),
``importlib.import_module("hubless.x")`` with a literal name, and a module importing its own
package. ``test_the_checks_see_every_kind_of_import`` plants each kind in a temporary source tree
and checks that they fail on it."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hubless"


def source_modules(src: Path) -> dict[str, Path]:
    """Every module of the package at ``src`` by dotted name (a package by its own name)."""
    return {".".join((src.name, *p.relative_to(src).with_suffix("").parts)).removesuffix(".__init__"): p for p in src.rglob("*.py")}


def lazy_exports(src: Path) -> dict[str, str]:
    """``_EXPORTS`` of the root ``__init__.py``: public name -> the module that defines it."""
    tree = ast.parse((src / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


@dataclass(frozen=True)
class Import:
    """One import of a module of the package: the module it loads and, for a from-import, the
    name it takes (None for ``import x.y``); ``lineno``, and whether it sits under TYPE_CHECKING."""

    module: str
    name: str | None
    lineno: int
    for_types: bool


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"


class Source:
    """The modules of a source tree and what each imports (see the module docstring)."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.root = src.name
        self.modules = source_modules(src)
        self.exports = lazy_exports(src)
        self.imports = {name: self._imports(name, path) for name, path in self.modules.items()}

    def _imports(self, module: str, path: Path) -> list[Import]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for_types = {id(n) for node in ast.walk(tree) if _is_type_checking(node) for n in ast.walk(node)}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = []
        for node in ast.walk(tree):
            typed = id(node) in for_types
            if isinstance(node, ast.Import):
                found += [Import(a.name, None, node.lineno, typed) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                found += [Import(base, a.name, node.lineno, typed) for a in node.names]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(Import(node.args[0].value, None, node.lineno, typed))
        return [i for i in found if i.module == self.root or i.module.startswith(self.root + ".")]

    def target(self, imp: Import) -> str:
        """The module an import makes Python run: ``from P import sub`` -> ``P.sub`` when it is a
        module, ``from hubless import X`` -> the module ``_EXPORTS`` names for X, else the
        module named (its longest prefix that is a module)."""
        module = imp.module
        if imp.name is not None and f"{module}.{imp.name}" in self.modules:
            module = f"{module}.{imp.name}"
        elif module == self.root and imp.name in self.exports:
            module = self.exports[imp.name]
        while module not in self.modules and "." in module:
            module = module.rpartition(".")[0]
        return module

    def graph(self) -> dict[str, set[str]]:
        """Module -> the modules it imports (itself left out)."""
        return {name: {t for i in imps if (t := self.target(i)) != name} for name, imps in self.imports.items()}


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def upward_imports(source: Source, layers: list[set[str]]) -> list[str]:
    """``"a imports b"`` for each import of a higher layer's module (or of a package with no layer)."""
    layer = {package: rank for rank, packages in enumerate(layers) for package in packages}
    found = []
    for name, imps in source.imports.items():
        for imp in imps:
            target = package_of(source.target(imp))
            if layer.get(target, len(layers)) > layer[package_of(name)]:
                found.append(f"{name} imports {source.target(imp)} (line {imp.lineno})")
    return sorted(found)


def import_circles(source: Source) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules, sorted (Tarjan)."""
    graph = source.graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


SOURCE = Source(SRC)
MODULES = SOURCE.modules

#: Every package (or top-level module) of hubless and its layer, lowest first. A module may
#: import from its own layer or below, never above (every kind of import counted, see the module
#: docstring): data flows one way, from files and arrays up to the command line. A new package
#: must be placed.
LAYERS = [
    {"hubless.errors", "hubless.progress", "hubless._deprecation"},
    {"hubless._atomic", "hubless._registry", "hubless._torch", "hubless._validation", "hubless._version", "hubless.hits"},
    {"hubless.storage"},  # array files, sharded sources, work files
    {"hubless.inputs"},  # every input file a user gives
    {"hubless.engine", "hubless.metrics"},  # streamed GEMM statistics; retrieval metrics
    {"hubless.banks", "hubless.corrections"},
    {"hubless.index", "hubless.encoders"},
    {"hubless.evaluation", "hubless.export", "hubless.rerank", "hubless.distributed", "hubless.learning"},
    {
        "hubless.tuning",
        "hubless.fairness",
        "hubless.score_matrices",
        "hubless.scores",  # the deprecated name of hubless.score_matrices (until 0.2.0)
        "hubless.search",
        "hubless.data",
        "hubless.attached",
    },
    {"hubless.demo", "hubless.reports", "hubless.service"},
    {"hubless.cli", "hubless.__main__", "hubless"},
]
LAYER = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def test_the_saved_index_modules_do_not_import_the_index():
    for module in ("disk", "pointer", "reading", "versions", "integrity"):
        name = f"hubless.index.{module}"
        assert "hubless.index.index" not in SOURCE.graph()[name], module


def test_private_hooks_are_not_called_from_outside_their_package():
    pattern = re.compile(r"\b(?:corr|correction|corrections\[\w+\]|c|updated|index|idx)\._[a-z]\w*\(")
    offenders = []
    for name, path in MODULES.items():
        if name.startswith(("hubless.corrections", "hubless.index")):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{name}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_package_has_a_layer():
    assert {package_of(m) for m in MODULES} <= set(LAYER), "place the new package in LAYERS"


def test_no_module_imports_a_higher_layer():
    upward = upward_imports(SOURCE, LAYERS)
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    circles = import_circles(SOURCE)
    assert not circles, f"import circles: {circles}"


def test_no_package_imports_another_packages_private_names():
    shared = ("hubless._atomic", "hubless._validation", "hubless._registry", "hubless._torch", "hubless._version")
    offenders = []
    for name, imps in SOURCE.imports.items():
        for imp in imps:
            head, last = (imp.module, imp.name) if imp.name is not None else imp.module.rpartition(".")[::2]
            if not last.startswith("_") or last.startswith("__") or package_of(head) == package_of(name):
                continue
            if package_of(head) in shared:
                continue  # shared helper modules: the underscore marks the module as internal, not its names
            offenders.append(f"{name} imports {head}.{last} (line {imp.lineno})")
    assert not offenders, "\n".join(sorted(offenders))


#: Each kind of import the checks must see, planted in ``hubless/low/a.py`` of a temporary tree
#: whose ``hubless/high/`` sits one layer above ``hubless/low/``.
PLANTED_UPWARD = {
    "top level": "from hubless.high.mod import thing\n",
    "plain import": "import hubless.high.mod\n",
    "inside a function": "def f():\n    from hubless.high.mod import thing\n    return thing\n",
    "under TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hubless.high.mod import thing\n",
    "relative": "from ..high.mod import thing\n",
    "relative, the package": "from ..high import mod\n",
    "a lazy export of hubless": "def f():\n    from hubless import Thing\n    return Thing\n",
    "import_module": "import importlib\nmod = importlib.import_module('hubless.high.mod')\n",
}
#: Circles planted in ``hubless/low/`` (a.py, b.py and the package's __init__.py).
PLANTED_CIRCLES = {
    "two modules": {"a.py": "from hubless.low.b import y\nx = 1\n", "b.py": "def f():\n    from hubless.low.a import x\n"},
    "relative": {"a.py": "from .b import y\nx = 1\n", "b.py": "from . import a\ny = 1\n"},
    "under TYPE_CHECKING": {
        "a.py": "from hubless.low.b import y\nx = 1\n",
        "b.py": "from typing import TYPE_CHECKING\ny = 1\nif TYPE_CHECKING:\n    from hubless.low.a import x\n",
    },
    "a module importing its own package": {"__init__.py": "from hubless.low.a import x\n", "a.py": "from hubless.low import y\nx = 1\n"},
    "relative, its own package": {"__init__.py": "from .a import x\n", "a.py": "from . import y\nx = 1\n"},
}
TOY_LAYERS = [{"hubless.low"}, {"hubless.high"}, {"hubless"}]


def _toy_tree(root: Path, low: dict[str, str]) -> Path:
    src = root / "hubless"
    files = {
        "__init__.py": "_EXPORTS = {'Thing': 'hubless.high.mod'}\n",
        "high/__init__.py": "",
        "high/mod.py": "from hubless.low.a import x\nthing = x\n",  # downward: allowed
        "low/__init__.py": "",
        "low/a.py": "x = 1\n",
        "low/b.py": "y = 2\n",
        **{f"low/{name}": text for name, text in low.items()},
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text, encoding="utf-8")
    return src


def test_the_checks_pass_a_clean_tree(tmp_path):
    source = Source(_toy_tree(tmp_path, {}))
    assert upward_imports(source, TOY_LAYERS) == [] and import_circles(source) == []
    assert source.graph()["hubless.high.mod"] == {"hubless.low.a"}


@pytest.mark.parametrize("kind", sorted(PLANTED_UPWARD))
def test_the_checks_see_every_kind_of_upward_import(tmp_path, kind):
    source = Source(_toy_tree(tmp_path, {"a.py": "x = 1\n" + PLANTED_UPWARD[kind]}))
    found = upward_imports(source, TOY_LAYERS)
    assert len(found) == 1 and found[0].startswith("hubless.low.a imports hubless.high"), found
    # and the upward import closes a circle with hubless.high.mod, which imports hubless.low.a
    assert any({"hubless.low.a", "hubless.high.mod"} <= set(c) for c in import_circles(source)), kind


@pytest.mark.parametrize("kind", sorted(PLANTED_CIRCLES))
def test_the_checks_see_every_kind_of_circle(tmp_path, kind):
    source = Source(_toy_tree(tmp_path, PLANTED_CIRCLES[kind]))
    assert upward_imports(source, TOY_LAYERS) == []
    circles = import_circles(source)
    assert len(circles) == 1 and "hubless.low.a" in circles[0], (kind, circles)


def test_every_module_the_architecture_page_names_exists():
    """docs/architecture.md names modules as ``hubless.pkg.mod`` or ``pkg.mod``: each is a module
    of the source, or a name a module defines (a renamed or removed module fails here)."""
    page = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = "|".join(sorted({package_of(m).removeprefix("hubless.") for m in MODULES if m != "hubless"}))
    named = set(re.findall(r"`(hubless(?:\.[a-z_][a-z0-9_]*)+)", page))
    files = ("faiss", "json", "npy", "npz", "parquet")  # `index.faiss` is a file of an index, not a module
    named |= {f"hubless.{n}" for n in re.findall(rf"`((?:{packages})\.[a-z_][a-z0-9_]*)`", page) if n.rpartition(".")[2] not in files}
    assert len(named) > 10  # the page names the modules it describes
    missing = []
    for name in sorted(named):
        if name in MODULES:
            continue
        module, _, attr = name.rpartition(".")
        source = MODULES[module].read_text(encoding="utf-8") if module in MODULES else ""
        if not re.search(rf"^(?:def|class) {attr}\b|^{attr}\b.*=|import .*\b{attr}\b", source, re.M):
            missing.append(name)
    assert not missing, f"docs/architecture.md names what the source does not have: {missing}"


#: A module is one job a reader can hold in mind: at most this many lines (issue 40).
MAX_MODULE_LINES = 500


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
