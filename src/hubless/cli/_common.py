"""Options and helpers shared by the sub-commands (loading inputs, parsing lists, errors)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from hubless.evaluation import file_digest
from hubless.inputs import load_embeddings

err_console = Console(stderr=True, soft_wrap=True)

METHOD_HELP = (
    "Correction spec, repeatable: baseline, nnn:alpha=0.75,k=16, dn:lam=0.5, csls:k=10, is:beta=20, "
    "dis:beta=20,k_activation=1, dualis:beta_query=20,beta_gallery=20, dualdis, gc."
)
NORMALIZE_HELP = "L2-normalise every input so scores are cosine similarities, as in the papers (default on)."


def parse_ints(text: str, name: str) -> list[int]:
    """'1,5,10' -> [1, 5, 10], with a clear error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{name} must be comma-separated integers such as 1,5,10; got {text!r}") from None
    if not values:
        raise typer.BadParameter(f"{name} is empty")
    return values


def load(path: Path | None, name: str, *, normalize: bool, dim: int | None = None):
    """Load an embeddings file (None passes through)."""
    if path is None:
        return None
    return load_embeddings(path, name, normalize=normalize, dim=dim)


def describe_file(path: Path | None, array) -> dict[str, Any] | None:
    """Path, shape and sha256 of an input, for results files."""
    if path is None:
        return None
    file = str(path).partition(":")[0] if not Path(path).exists() else str(path)
    return {"path": str(path), "shape": list(array.shape), "sha256": file_digest(file)}


def friendly_errors(func: Callable) -> Callable:
    """Turn the library's input errors into a one-line message and exit code 2 (no traceback)."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (ValueError, OSError, KeyError, TypeError, ImportError) as exc:
            err_console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(2) from None

    return wrapper


def wide_console() -> Console:
    """A console for result tables: on a terminal its width, otherwise (pipes, CI logs) 160
    columns so tables are not folded."""
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def read_items(path: Path) -> list[str]:
    """What a reranker sees per row: a .txt (one path or text per line), a .json list, or the
    OUT.meta.json of `hubless embed` (its items' paths or texts, in row order)."""
    import json

    if not Path(path).is_file():
        raise FileNotFoundError(f"no such items file: {path}")
    if str(path).endswith(".json"):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and "items" in data:
            return [item.get("path", item.get("text")) for item in data["items"]]
        if isinstance(data, list):
            return [str(x) for x in data]
        raise ValueError(f"{path}: expected a JSON list or an embed .meta.json")
    return Path(path).read_text(encoding="utf-8").splitlines()
