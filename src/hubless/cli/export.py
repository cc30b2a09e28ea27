"""``hubless export idx/ --to STORE [--sync]``: write the corrected gallery into a vector store."""

from __future__ import annotations

from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput


def parse_options(pairs: list[str] | None) -> dict:
    """``--option key=value`` pairs as keyword arguments (ints, floats, true/false, text)."""
    out: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--option takes key=value; got {pair!r}")
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


@friendly_errors
def export_command(
    index_dir: Path = typer.Argument(..., help="A saved hubless index directory."),
    to: str = typer.Option(
        ...,
        "--to",
        help="Store URI: lancedb://path/table, postgresql://user@host:port/db/table, qdrant://path/collection, "
        "qdrant+http://host:port/collection, milvus://path/collection, chroma://path/collection.",
    ),
    overwrite: bool = typer.Option(False, help="Replace an existing table/collection (the new rows are written before the old ones go)."),
    sync: bool = typer.Option(
        False, "--sync", help="Update an earlier export of this index in place: only new, changed and removed rows are written."
    ),
    ann: str = typer.Option(
        None,
        help="Also build an ANN index on \\[r, bias] (inner product): IVF_PQ or IVF_FLAT (LanceDB), HNSW (pgvector, Qdrant, Chroma), "
        "HNSW or IVF_FLAT (Milvus).",
    ),
    target_recall: float = typer.Option(
        None, help="With --ann: make the smallest search knob measured to reach this recall@10 on the index's query bank the default."
    ),
    batch: int = typer.Option(8192, help="Rows written per batch."),
    option: list[str] = typer.Option(
        None, "--option", help="A store option key=value (repeatable), e.g. partitions=64 (see docs/stores.md)."
    ),
) -> None:
    """Export \\[r, bias(r)] (+ plain r and metadata) to a vector store searched by inner product."""
    from hubless.export import export
    from hubless.index import Index

    index = Index.load(index_dir)
    options = parse_options(option)
    if sync:
        from hubless.export import sync as sync_store

        if overwrite or ann or target_recall is not None or options:
            raise InvalidInput(
                "--sync updates the rows of an existing store; --overwrite, --ann, --target-recall and --option belong to a full export"
            )
        done = sync_store(index, to)
        typer.echo(f"synced {to}: {done['written']} row(s) written, {done['removed']} removed, {done['unchanged']} unchanged")
        return
    store = export(index, to, overwrite=overwrite, ann=ann, target_recall=target_recall, batch=batch, **options)
    typer.echo(f"exported {index.ntotal} items ({index.correction.spec}) to {to}")
    chosen = (store.describe().get("ann") or {}) if ann else {}
    if chosen.get("curve"):
        typer.echo(f"{chosen['knob']}={chosen['default']}: recall@10 {chosen['recall']} on the index's query bank")
