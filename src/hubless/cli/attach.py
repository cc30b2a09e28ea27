"""``hubless attach SOURCE --query-bank bank.npy -m SPEC --out sidecar/``: correct a collection the
user already has (a FAISS index file or a vector database collection) without re-exporting it;
``--update`` keeps the sidecar in step, ``--search`` searches through the store's own ANN."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput


@friendly_errors
def attach_command(
    source: str = typer.Argument(
        ...,
        help="The collection: a FAISS index file (inner product), lancedb://path/table, qdrant://path/collection (in process), "
        "qdrant+http://host:port/collection, postgresql://user@host:port/db/table (pgvector), chroma://path/collection or "
        "milvus://path/file.db/collection.",
    ),
    out: Path = typer.Option(..., "--out", help="The sidecar directory (biases keyed by the collection's ids, the spec, fingerprints)."),
    query_bank: Path = typer.Option(None, help="Reference queries (.npy/.npz), the same bank for --update."),
    gallery_bank: Path = typer.Option(None, help="Reference items of the collection's modality (DualIS, DualDIS; optional for DN)."),
    method: str = typer.Option("nnn:alpha=0.75,k=16", "-m", "--method", help="The correction's spec (an additive one: not GC)."),
    update: bool = typer.Option(False, "--update", help="Bring the sidecar in step with the collection: read only added items."),
    search: Path = typer.Option(None, "--search", help="Query embeddings to search the attached collection with (JSON lines out)."),
    top_k: int = typer.Option(10, help="With --search: results per query."),
    metadata: bool = typer.Option(False, "--metadata", help="With --search: also print each hit's metadata from the store."),
    exact: bool = typer.Option(
        False, "--exact", help="With --search: also search exactly (a full scan) and print the recall@k of the attached search against it."
    ),
    candidates: int = typer.Option(None, help="With --search: the first k' plain candidates per query (default 8 x top-k)."),
    max_candidates: int = typer.Option(None, help="With --search: the largest k' an uncertified query is widened to."),
    weight: float = typer.Option(None, help="With --search: the correction's weight (NNN's alpha, DN's lambda)."),
    nprobe: int = typer.Option(None, help="With --search: IVF partitions probed (FAISS IVF, LanceDB)."),
    ef_search: int = typer.Option(None, help="With --search: HNSW beam (FAISS HNSW, Qdrant)."),
    id_field: str = typer.Option(None, help="LanceDB, pgvector: the id column (default id)."),
    vector_field: str = typer.Option(
        None, help="LanceDB: the vector column (default vector); pgvector: (default embedding); Qdrant, Milvus: the named vector."
    ),
    metric: str = typer.Option(None, help="LanceDB, pgvector: dot (default) or cosine."),
    batch: int = typer.Option(8192, help="Items read per batch."),
    write_payload: bool = typer.Option(
        False,
        "--write-payload",
        help="Also write each item's bias into the collection as a payload field / column (LanceDB, Qdrant, pgvector, Chroma, "
        "Milvus; no vector re-inserted); --update keeps it in step. A FAISS file has no payload: refused.",
    ),
    payload_field: str = typer.Option(
        "hubless_bias", help="With --write-payload: the field's name (name_0, name_1, ... for several columns)."
    ),
) -> None:
    """Attach a correction to a collection you already have (only read; a sidecar is written)."""
    from hubless.attached import AttachedCollection, attach
    from hubless.attached import update as update_sidecar
    from hubless.inputs import load_array

    options = {k: v for k, v in (("id_field", id_field), ("vector_field", vector_field), ("metric", metric)) if v is not None}
    if update and search is not None:
        raise InvalidInput("give --update or --search, not both")
    if write_payload and (update or search is not None):
        raise InvalidInput(
            "--write-payload goes with attaching: --update keeps the field an attach wrote in step, --search reads the sidecar"
        )
    if search is not None:
        attached = AttachedCollection.open(source, out, **options)
        queries = load_array(search)
        knobs: dict[str, float] = {k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search)) if v is not None}
        if weight is not None:
            knobs["weight"] = weight
        result = attached.search_certified(queries, top_k, candidates=candidates, max_candidates=max_candidates, metadata=metadata, **knobs)
        for i in range(len(result.ids)):
            found = result.ids[i] >= 0
            typer.echo(
                json.dumps(
                    {
                        "query": i,
                        "ids": result.ids[i][found].tolist(),
                        "scores": [round(float(s), 6) for s in result.scores[i][found]],
                        "certified": bool(result.certified[i]),
                        "candidates": int(result.candidates[i]),
                        **({"metadata": result.metadata[i]} if result.metadata is not None else {}),
                    },
                    default=str,
                )
            )
        typer.echo(f"certified {int(result.certified.sum())} of {len(result.ids)} queries", err=True)
        if exact:
            from hubless.attached.certified import recall_at_k

            want = (attached.exact_search(queries, top_k) if weight is None else attached.exact_search(queries, top_k, weight=weight))[1]
            typer.echo(f"recall@{top_k} against exact corrected search: {recall_at_k(result.ids, want):.4f}", err=True)
        return
    if query_bank is None:
        raise InvalidInput("--query-bank is required to attach or update (the reference queries the biases are computed against)")
    qb = load_array(query_bank)
    gb = None if gallery_bank is None else load_array(gallery_bank)
    if update:
        report = update_sidecar(out, source, qb, gallery_bank=gb, batch=batch, **options)
        typer.echo(
            f"updated {out}: {report['added']} added, {report['removed']} removed, {report['items']} items; "
            f"read {report['read_items']} items' vectors ({report['bytes_read']} bytes)"
        )
        if report["refit"]:
            typer.echo(f"refit: {report['refit']}")
        if report["payload_items"]:
            typer.echo(f"wrote the bias into the payload of {report['payload_items']} items")
        return
    attached = attach(
        source, qb, method, out=out, gallery_bank=gb, batch=batch, write_payload=payload_field if write_payload else False, **options
    )
    done = attached.sidecar.info["attached"]
    typer.echo(f"attached {attached.spec} to {source}: {attached.ntotal} items read in {done['seconds']} s; sidecar {out}")
    written = attached.sidecar.info.get("payload")
    if written:
        typer.echo(
            f"wrote the bias into payload field {', '.join(written['fields'])} of {written['items']} items in {written['seconds']} s"
        )
