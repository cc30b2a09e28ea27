"""The layers of the code stay clean: every package has a layer and imports only its own or
lower ones, there is no import circle, and no module reaches into another package's private
names or hooks (checked on the source, imports inside functions included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hubless"


def _module(path: Path) -> str:
    return ".".join(("hubless", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The hubless modules (and ``module.name`` of from-imports) a file imports when it runs:
    imports inside functions included unless ``top_level_only``; ``if TYPE_CHECKING:`` blocks
    left out (they never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for_types = {id(n) for node in ast.walk(tree) if _is_type_checking(node) for n in ast.walk(node)}
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if id(node) in for_types:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("hubless")}


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def test_the_saved_index_modules_do_not_import_the_index():
    for module in ("disk", "pointer", "reading", "versions", "integrity"):
        assert not {m for m in _imports(MODULES[f"hubless.index.{module}"]) if m.startswith("hubless.index.index")}, module


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


#: Every package (or top-level module) of hubless and its layer, lowest first. A module may
#: import from its own layer or below, never above (imports inside functions included): data
#: flows one way, from files and arrays up to the command line. A new package must be placed.
LAYERS = [
    {"hubless.errors", "hubless.progress"},
    {"hubless._io", "hubless._registry", "hubless._torch", "hubless._validation", "hubless.hits"},
    {"hubless.io"},  # array files, sharded sources, work files
    {"hubless.inputs"},  # every input file a user gives
    {"hubless.engine", "hubless.metrics"},  # streamed GEMM statistics; retrieval metrics
    {"hubless.banks", "hubless.corrections"},
    {"hubless.index", "hubless.encoders"},
    {"hubless.evaluation", "hubless.export", "hubless.rerank", "hubless.distributed", "hubless.learning"},
    {"hubless.tuning", "hubless.fairness", "hubless.scores", "hubless.search", "hubless.data", "hubless.attached"},
    {"hubless.demo", "hubless.reports", "hubless.service"},
    {"hubless.cli", "hubless.__main__", "hubless"},
]
LAYER = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_package_has_a_layer():
    assert {_package(m) for m in MODULES} <= set(LAYER), "place the new package in LAYERS"


def test_no_module_imports_a_higher_layer():
    upward = []
    for name, path in MODULES.items():
        for target in _imports(path):
            if target == "hubless" or _package(target) not in LAYER:
                continue
            if LAYER[_package(target)] > LAYER[_package(name)]:
                upward.append(f"{name} imports {target}")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_circles_even_through_imports_inside_functions():
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for m in _imports(path):
            while m and m not in MODULES:
                m = m.rpartition(".")[0]
            if m and m != name and not name.startswith(m + "."):  # a module importing its own package: not a circle
                targets.add(m)
        graph[name] = targets
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def strongly_connected(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongly_connected(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in sorted(graph):
        if v not in index:
            strongly_connected(v)
    assert not circles, f"import circles: {[sorted(c) for c in circles]}"


def test_no_package_imports_another_packages_private_names():
    offenders = []
    for name, path in MODULES.items():
        for target in _imports(path):
            head, _, last = target.rpartition(".")
            if last.startswith("_") and not last.startswith("__") and head.startswith("hubless.") and _package(head) != _package(name):
                if _package(head) in ("hubless._io", "hubless._validation", "hubless._registry", "hubless._torch"):
                    continue  # shared helper modules: the underscore marks the module as internal, not its names
                offenders.append(f"{name} imports {target}")
    assert not offenders, "\n".join(sorted(offenders))


def test_every_module_the_architecture_page_names_exists():
    """docs/architecture.md names modules as ``hubless.pkg.mod`` or ``pkg.mod``: each is a module
    of the source, or a name a module defines (a renamed or removed module fails here)."""
    page = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = "|".join(sorted({_package(m).removeprefix("hubless.") for m in MODULES if m != "hubless"}))
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
