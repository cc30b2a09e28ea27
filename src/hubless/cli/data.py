"""``hubless data``: get the benchmark caption files."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput

app = typer.Typer(
    help="Example and benchmark data: synthetic embeddings under the names the docs use (synthetic), COCO and Flickr30k caption splits (fetch, export) and VisoGender metadata (fetch visogender, visogender).",
    no_args_is_help=True,
)


@app.command("fetch")
@friendly_errors
def fetch_command(
    dataset: str = typer.Argument(..., help="coco, flickr30k or visogender"),
    dest: Path = typer.Option(None, help="Folder to write into (default: $HUBLESS_DATA_DIR or ./data)."),
    archive: Path = typer.Option(
        None, help="A local copy instead of downloading: caption_datasets.zip (coco, flickr30k) or a folder with the VisoGender TSVs."
    ),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Refuse files that differ from the release (VisoGender: pinned sha256; Karpathy: split sizes)."
    ),
    sha256: str = typer.Option(None, help="coco/flickr30k: the sha256 the downloaded caption_datasets.zip must have."),
) -> None:
    """Download Karpathy's caption splits (coco, flickr30k) or the VisoGender metadata
    (github.com/oxai/visogender, pinned and checksummed) and write the files hubless reads."""
    import os

    from hubless.data.fetch import fetch
    from hubless.data.visogender import fetch_visogender

    dest = dest or Path(os.environ.get("HUBLESS_DATA_DIR", "data"))
    try:
        if dataset == "visogender":
            files = fetch_visogender(dest, source=archive, verify=verify)
        else:
            files = fetch(dataset, dest, archive=archive, verify=verify, sha256=sha256)
    except ConnectionError as exc:
        raise InvalidInput(str(exc)) from None
    for f in files:
        typer.echo(f"wrote {f}")


@app.command("export")
@friendly_errors
def export_command(
    dataset: str = typer.Argument(..., help="coco or flickr30k"),
    split: str = typer.Argument(..., help="test5k, test1k or dev"),
    out: Path = typer.Option(..., help="Folder for captions.txt (and images.txt with --image-root)."),
    image_root: Path = typer.Option(None, help="Folder holding the split's images (e.g. coco/val2014)."),
) -> None:
    """Write a split's captions (one per line, 5 per image, image order) and, when you have the
    images, their paths in the same order: the inputs of `hubless embed --texts/--images`."""
    from hubless._atomic import write_text
    from hubless.data.karpathy import load_captions

    split_data = load_captions(dataset, split)
    paths = split_data.image_paths(image_root) if image_root is not None else None  # check before writing
    written = [write_text(out / "captions.txt", "\n".join(split_data.captions) + "\n")]
    if paths is not None:
        written.append(write_text(out / "images.txt", "\n".join(str(p) for p in paths) + "\n"))
    for f in written:
        typer.echo(f"wrote {f}")
    typer.echo(f"{split_data.n_images} images, {len(split_data.captions)} captions (caption j describes image j // 5: truth t2i:5 / i2t:5)")


@app.command("visogender")
@friendly_errors
def visogender_command(
    out: Path = typer.Option(..., help="Folder for gallery_meta.csv, query_meta.csv and the embeddings."),
    bias: float = typer.Option(0.5, help="Planted lean of the neutral queries towards 'masculine' (0: none)."),
    dim: int = typer.Option(64, help="Dimension of the synthetic embeddings."),
    seed: int = typer.Option(0, help="Seed."),
) -> None:
    """VisoGender metadata (occupations, perceived gender) with seeded synthetic embeddings, ready
    for `hubless fairness` (real images are URLs only and cannot be embedded here)."""
    import csv

    from hubless._atomic import atomic_open, save_npy
    from hubless.data.fairness import visogender_audit_data

    rows, queries, gallery, q, bank = visogender_audit_data(bias=bias, dim=dim, seed=seed)  # the options checked first
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (("gallery_meta.csv", rows), ("query_meta.csv", queries)):
        with atomic_open(out / name) as fh:
            writer = csv.DictWriter(fh, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    for name, arr in (("gallery.npy", gallery), ("queries.npy", q), ("query_bank.npy", bank)):
        save_npy(out / name, arr)
    typer.echo(f"wrote {len(rows)} VisoGender items and {len(queries)} neutral queries (synthetic embeddings, bias {bias}) to {out}")


@app.command("synthetic")
@friendly_errors
def synthetic_command(
    out: Path = typer.Option(..., help="Folder to write the files into (created if needed)."),
    n_items: int = typer.Option(1000, help="Gallery items (images); each has 5 captions as queries."),
    dim: int = typer.Option(64, help="Dimension of the embeddings."),
    seed: int = typer.Option(0, help="Seed (the demo's default is 0)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace files of these names that exist in --out."),
) -> None:
    """Write the demo's synthetic embeddings (images, captions, banks, a validation split, new items)
    under the file names every example of the docs uses: images.npy, captions.npy, bank_captions.npy ..."""
    from hubless.data.synthetic import EXAMPLE_FILES, write_example_files

    written = write_example_files(out, n_items=n_items, dim=dim, seed=seed, overwrite=overwrite)
    for path in written:
        typer.echo(f"wrote {path}: {EXAMPLE_FILES[path.name]}")
