"""``hubless export idx/ --to STORE [--sync]``: write the corrected gallery into a vector store (LanceDB, pgvector, Qdrant)."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput


@friendly_errors
def export_command(
    index_dir: Path = typer.Argument(..., help="A saved hubless index directory."),
    to: str = typer.Option(
        ...,
        "--to",
        help="Store URI: lancedb://path/table, postgresql://user@host:port/db/table, qdrant://path/collection, qdrant+http://host:port/collection.",
    ),
    overwrite: bool = typer.Option(False, help="Replace an existing table/collection (the new rows are written before the old ones go)."),
    sync: bool = typer.Option(
        False, "--sync", help="Update an earlier export of this index in place: only new, changed and removed rows are written."
    ),
    ann: str = typer.Option(
        None, help="Also build an ANN index on \\[r, bias] (inner product): IVF_PQ or IVF_FLAT (LanceDB), HNSW (pgvector, Qdrant)."
    ),
) -> None:
    """Export \\[r, bias(r)] (+ plain r and metadata) to a vector store searched by inner product."""
    from hubless.export import export
    from hubless.index import Index

    index = Index.load(index_dir)
    if sync:
        from hubless.export import sync as sync_store

        if overwrite or ann:
            raise InvalidInput("--sync updates the rows of an existing store; --overwrite and --ann belong to a full export")
        done = sync_store(index, to)
        typer.echo(f"synced {to}: {done['written']} row(s) written, {done['removed']} removed, {done['unchanged']} unchanged")
        return
    export(index, to, overwrite=overwrite, ann=ann)
    typer.echo(f"exported {index.ntotal} items ({index.correction.spec}) to {to}")
