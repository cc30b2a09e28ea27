"""``hubless data``: get the benchmark caption files."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import friendly_errors

app = typer.Typer(help="Benchmark data: COCO and Flickr30k Karpathy caption splits.", no_args_is_help=True)


@app.command("fetch")
@friendly_errors
def fetch_command(
    dataset: str = typer.Argument(..., help="coco or flickr30k"),
    dest: Path = typer.Option(None, help="Folder to write into (default: $HUBLESS_DATA_DIR or ./data)."),
    archive: Path = typer.Option(None, help="A local caption_datasets.zip instead of downloading it."),
) -> None:
    """Download Karpathy's caption splits and write the caption files hubless reads."""
    import os

    from hubless.data.fetch import fetch

    try:
        files = fetch(dataset, dest or Path(os.environ.get("HUBLESS_DATA_DIR", "data")), archive=archive)
    except ConnectionError as exc:
        raise ValueError(str(exc)) from None
    for f in files:
        typer.echo(f"wrote {f}")
