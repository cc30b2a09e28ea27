"""Every command with generated options (hypothesis): each command's own options, read from the
command line app itself, given values from a pool of good and bad ones (valid and damaged files,
folders, missing paths, odd numbers, bad specs and filters). Whatever the mix, a command either
works (exit 0) or says what is wrong in one line (exit 2, a usage error included); never exit 1,
which is hubless's "a bug" (an unexpected exception), and never a traceback.

Left out: what starts a server (``serve``, ``demo --serve``) or needs the network or a model
(``data fetch``, ``embed``, text and image queries), Ray (``augment``, ``--ray``) and what reads
the shared data sets (``data export``)."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hubless.cli.main import app
from tests.conftest import needs_shared, unit_rows

#: The fuzz's examples: the same every run and in every checkout (derandomize's seed depends
#: on the test file's path).
SEED = 20261127

pytestmark = pytest.mark.slow

runner = CliRunner()
#: Commands (space-separated paths) and options left out (see the module docstring).
SKIPPED_COMMANDS = {"serve", "data fetch", "data export", "embed", "augment", "demo"}
SKIPPED_OPTIONS = {"--model", "--text", "--texts", "--image", "--images", "--device", "--ray", "--address", "--workers", "--serve",
                   "--port", "--progress", "--help", "--rerank", "--reranker", "--debug"}  # fmt: skip


def _commands() -> dict[str, list]:
    found: dict[str, list] = {}

    def walk(command, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{path} {name}".strip())
        elif path not in SKIPPED_COMMANDS:
            found[path] = [p for p in command.params if not (set(getattr(p, "opts", [])) & SKIPPED_OPTIONS)]

    walk(typer.main.get_command(app), "")
    return found


COMMANDS = _commands()

#: A working invocation of each command ({name}: a file of the pool, {out}: a fresh output path,
#: {idx}: a fresh copy of the pool's index); the fuzz changes some of its values and adds options.
BASE = {
    "methods": [],
    "eval": ["--gallery", "{g}", "--queries", "{q}", "--truth", "{truth}", "--query-bank", "{b}", "-m", "nnn:k=3", "--bootstrap", "0"],
    "tune": ["--gallery", "{g}", "--validation-queries", "{q}", "--validation-truth", "{truth}", "--query-bank", "{b}", "-m", "nnn"],
    "correct": ["--scores", "{scores}", "--query-bank-scores", "{bank_scores}", "-m", "nnn:k=3", "--out", "{out}.npy"],
    "search": ["{idx}", "--queries", "{q}", "--top-k", "3"],
    "export": ["{idx}", "--to", "lancedb://{out}/db/t"],
    "attach": ["{faiss}", "--query-bank", "{b}", "-m", "nnn:k=3", "--out", "{out}"],
    "fairness": ["--gallery", "{g}", "--gallery-meta", "{meta}", "--queries", "{q}", "--query-meta", "{meta}", "--attributes", "gender",
                 "--match", "caption", "--query-bank", "{b}", "--method", "nnn:k=3"],
    "data visogender": ["--out", "{out}", "--dim", "8"],
    "data synthetic": ["--out", "{out}", "--n-items", "20", "--dim", "8"],
    "bank check": ["--gallery", "{g}", "--query-bank", "{b}"],
    "bank adversarial": ["--gallery", "{g}", "--candidates", "{b}", "--n", "3", "--out", "{out}.npy"],
    "index build": ["--gallery", "{g}", "--query-bank", "{b}", "--out", "{out}"],
    "index info": ["{idx}"],
    "index add": ["{idx}", "--embeddings", "{q}"],
    "index calibrate": ["{idx}", "--top-k", "3"],
    "index remove": ["{idx}", "--ids", "1,2"],
    "index update-metadata": ["{idx}", "--ids", "1", "--set", '{"year": 5}'],
    "index get": ["{idx}", "--ids", "0,1"],
    "index compact": ["{idx}"],
    "index versions": ["{idx}"],
    "index restore": ["{idx}", "--version", "1"],
    "index verify": ["{idx}"],
}  # fmt: skip


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Values an option or argument may get: good files of each kind, damaged and odd ones."""
    faiss = pytest.importorskip("faiss")
    root = tmp_path_factory.mktemp("cli-fuzz")
    rng = np.random.default_rng(9)
    gallery = unit_rows(rng, 30, 8)
    np.save(root / "g.npy", gallery)
    np.save(root / "q.npy", unit_rows(rng, 30, 8))
    np.save(root / "b.npy", unit_rows(rng, 40, 8))
    np.save(root / "d16.npy", unit_rows(rng, 30, 16))
    np.save(root / "scores.npy", rng.standard_normal((30, 30)).astype(np.float32))
    np.save(root / "bank_scores.npy", rng.standard_normal((40, 30)).astype(np.float32))
    np.save(root / "truth.npy", np.arange(30))
    np.save(root / "nan.npy", np.full((30, 8), np.nan, np.float32))
    (root / "cut.npy").write_bytes((root / "g.npy").read_bytes()[:100])
    (root / "meta.json").write_text(json.dumps([{"caption": f"c{i}", "gender": "ab"[i % 2], "year": i} for i in range(30)]))
    (root / "ids.txt").write_text("\n".join(map(str, range(3))))
    (root / "notes.txt").write_text("not an array")
    (root / "adir").mkdir()
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    index.add_with_ids(gallery, np.arange(30, dtype=np.int64) * 3)
    faiss.write_index(index, str(root / "faiss.faiss"))
    built = runner.invoke(app, ["index", "build", "--gallery", str(root / "g.npy"), "--query-bank", str(root / "b.npy"),
                                "--metadata", str(root / "meta.json"), "--out", str(root / "idx")])  # fmt: skip
    assert built.exit_code == 0, built.output
    names = ["g.npy", "q.npy", "b.npy", "d16.npy", "scores.npy", "bank_scores.npy", "truth.npy", "nan.npy", "cut.npy", "meta.json",
             "ids.txt", "notes.txt", "adir", "idx", "faiss.faiss", "missing.npy"]  # fmt: skip
    return root, {name.split(".")[0]: str(root / name) for name in names}


WORDS = ["nnn", "is:beta=20", "dis", "csls:k=3", "nnn:k=0", "bogus", "t2i:1", "i2t:1", "t2i:x", "gender", "caption", "year",
         "-1", "0", "1", "3", "2.5", "1e9", "nan", "inf", "", "abc", '{"year": 3}', '{"year": {"gte": 2}}', '{"nope": 1}', "{bad",
         "[]", "1,2", "0.99", "IVF2,Flat", "Flat", "HNSW8", "lancedb://x", "R@1", "recall", "max"]  # fmt: skip


@st.composite
def invocations(draw, files: dict[str, str], fill: dict[str, str]) -> list[str]:
    """A command's working invocation with up to two values replaced and up to three options
    added, each from the pool."""
    name = draw(st.sampled_from(sorted(BASE)))
    args = name.split() + [re.sub(r"\{(\w+)\}", lambda m: fill.get(m.group(1), m.group(0)), a) for a in BASE[name]]
    values = st.sampled_from(sorted(files.values())) | st.sampled_from(WORDS) | st.just(fill["out"] + "-2")
    first = len(name.split())
    slots = [i for i in range(first, len(args)) if not args[i].startswith("-")]
    replaced, added = draw(st.sampled_from([0, 0, 1, 2])), draw(st.sampled_from([0, 0, 1, 2, 3]))  # unchanged one time in five
    for i in (
        draw(st.lists(st.sampled_from(slots), min_size=min(replaced, len(slots)), max_size=min(replaced, len(slots)), unique=True))
        if slots
        else []
    ):
        args[i] = draw(values)
    options = [p for p in COMMANDS[name] if p.param_type_name == "option"]
    for p in (
        draw(
            st.lists(
                st.sampled_from(options), min_size=min(added, len(options)), max_size=min(added, len(options)), unique_by=lambda p: p.name
            )
        )
        if options
        else []
    ):
        flag = p.opts[0]
        if getattr(p, "is_flag", False):
            args.append(draw(st.sampled_from([flag, *p.secondary_opts])) if p.secondary_opts else flag)
        else:
            args += [flag, draw(values)]
    return args


@seed(SEED)
@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def _fuzz(seen: Counter, pool, tmp_path_factory, data) -> None:
    root, files = pool
    work = tmp_path_factory.mktemp("run")
    shutil.copytree(files["idx"], work / "idx")  # a command that writes the index writes its own copy
    fill = {**files, "idx": str(work / "idx"), "out": str(work / "out")}
    args = data.draw(invocations(files, fill))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)  # a relative path given as an output lands here, not in the checkout
        result = runner.invoke(app, args, catch_exceptions=True)
    output = result.output
    seen[args[0] if args[0] not in ("index", "bank", "data") else " ".join(args[:2]), result.exit_code] += 1
    assert result.exit_code in (0, 2), f"exit {result.exit_code} for {args}: {output[-600:]}"
    assert "Traceback" not in output and "a bug in hubless" not in output, (args, output[-600:])
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))


def test_every_command_works_or_says_what_is_wrong_in_one_line(pool, tmp_path_factory):
    """The fuzz, then what it did: many of its invocations worked, over many commands (so the
    changes it makes do not only ever hit the first check; each command's unchanged invocation
    is checked to work on its own below)."""
    seen: Counter = Counter()
    _fuzz(seen, pool, tmp_path_factory)
    worked = {name for (name, code) in seen if code == 0}
    assert len(worked) >= len(BASE) // 2 and sum(n for (_, code), n in seen.items() if code == 0) >= 25, sorted(seen.items())


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_shared("visogender")) if n == "data visogender" else n for n in sorted(BASE)])
def test_each_command_s_working_invocation_works(pool, tmp_path, monkeypatch, name):
    """The fuzz's starting points, unchanged: each command does its job (so the fuzz's changes
    start from work that succeeds)."""
    root, files = pool
    shutil.copytree(files["idx"], tmp_path / "idx")
    fill = {**files, "idx": str(tmp_path / "idx"), "out": str(tmp_path / "out")}
    args = name.split() + [re.sub(r"\{(\w+)\}", lambda m: fill.get(m.group(1), m.group(0)), a) for a in BASE[name]]
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output[-800:])
