"""``hubless augment``: write a corrected gallery as [r, bias(r)] ``.npy`` parts on Ray (the gallery never on the driver)."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import NORMALIZE_HELP, friendly_errors


@friendly_errors
def augment_command(
    gallery: str = typer.Option(
        ..., help="Gallery embeddings: a folder, glob or file of .npy/parquet shards, or a clip-retrieval img_emb folder."
    ),
    out: Path = typer.Option(
        ..., help="Folder to write part_NNNNN.npy (\\[r, bias(r)]) and hubless.json to (new, empty or an earlier run's)."
    ),
    query_bank: str = typer.Option(None, help="Reference queries the correction is fitted on (shards as --gallery)."),
    gallery_bank: str = typer.Option(None, help="Reference gallery-modality items (DualIS, DN), shards as --gallery."),
    method: str = typer.Option("nnn:alpha=0.75,k=16", help="Correction spec served by rows: nnn, dn, is, dualis or baseline."),
    shard_rows: int = typer.Option(32768, help="Gallery rows per part (one Ray task each)."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
    address: str = typer.Option(None, help="Ray cluster to run on (ray://host:10001, auto). Default: a local Ray."),
    work_dir: Path = typer.Option(None, help="Keep finished statistics tiles here; a rerun computes only the missing ones."),
    gallery_rows: int = typer.Option(32768, help="Gallery rows per statistics tile (one Ray task each)."),
    bank_cols: int = typer.Option(
        65536, help="Bank items per tile; a task reads them 65,536 at a time, so a tile may span the whole bank (fewer tiles)."
    ),
    workers: int = typer.Option(None, help="Tiles computed at once, each task taking an equal share of the CPUs (default: 1 CPU each)."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
) -> None:
    """Fit a correction on Ray and write the gallery as \\[r, bias(r)] parts for any inner-product engine.

    Query them with \\[q, -W(q)] from hubless.distributed.augmented_queries(OUT, queries)."""
    import json

    import hubless.distributed as hd
    from hubless.corrections import make_correction

    corr = make_correction(method).set_params(normalize=normalize)
    folder = hd.write_augmented(
        corr,
        gallery,
        query_bank,
        gallery_bank,
        out,
        shard_rows=shard_rows,
        address=address,
        work_dir=work_dir,
        progress=progress,
        gallery_rows=gallery_rows,
        bank_cols=bank_cols,
        workers=workers,
    )
    info = json.loads((folder / "hubless.json").read_text())
    typer.echo(
        f"wrote {info['n_items']} items ({info['spec']}) as {len(info['parts'])} part(s) of {info['dim']} + {info['bias_columns']} columns -> {folder}"
    )
