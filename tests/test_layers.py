"""The layers of the code stay clean: data flows one way and no module reaches into another
package's private hooks (checked on the source, imports inside functions included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hubless"


def _module(path: Path) -> str:
    return ".".join(("hubless", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("hubless")}


MODULES = {_module(p): p for p in SRC.rglob("*.py")}

#: package -> packages it must never import (the data flow: engine -> corrections -> index ->
#: evaluation/tuning/fairness/rerank -> search -> reports/service -> cli).
MEASURING = ("hubless.evaluation", "hubless.tuning", "hubless.fairness", "hubless.rerank")
PRESENTING = ("hubless.cli", "hubless.reports", "hubless.service")
FORBIDDEN = {
    "hubless.engine": ("hubless.corrections", "hubless.index", *MEASURING, *PRESENTING),
    "hubless.metrics": ("hubless.corrections", "hubless.index", "hubless.engine", *MEASURING, *PRESENTING),
    "hubless.corrections": ("hubless.index", *MEASURING, *PRESENTING),
    "hubless.index": (*MEASURING, *PRESENTING),
    "hubless.evaluation": ("hubless.index", *PRESENTING),
    "hubless.distributed": (*MEASURING, *PRESENTING),
    "hubless.search": PRESENTING,
    "hubless.progress": ("hubless.",),
}


def test_lower_layers_never_import_higher_ones():
    problems = []
    for name, path in MODULES.items():
        for package, banned in FORBIDDEN.items():
            if name == package or name.startswith(package + "."):
                problems += [f"{name} imports {m}" for m in _imports(path) if m.startswith(banned)]
        if not name.startswith(("hubless.cli", "hubless.__main__")):
            problems += [f"{name} imports {m}" for m in _imports(path) if m.startswith("hubless.cli")]
    assert not problems, "\n".join(problems)


def test_index_store_does_not_import_the_index():
    assert not {m for m in _imports(MODULES["hubless.index.store"]) if m.startswith("hubless.index.index")}


def test_no_import_cycles_between_modules_at_import_time():
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for m in _imports(path, top_level_only=True):
            while m and m not in MODULES:
                m = m.rpartition(".")[0]
            if m and m != name:
                targets.add(m)
        graph[name] = targets

    # a package importing its own submodules (its __init__) is not a cycle
    def edges(n):
        return {t for t in graph[n] if not n.startswith(t + ".")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for t in edges(n):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(t) :], t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n)


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
