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
    update: bool = typer.Option(
        False, "--update", help="Bring the sidecar in step with the collection: ids, added items and a rotating sample of vectors."
    ),
    full: bool = typer.Option(
        False, "--full", help="With --update: read every vector once and refit exactly the items changed in place (a FAISS file: always)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a sidecar already in --out (it is never replaced without)."),
    beam_recall: float = typer.Option(
        None, help="ANN stores: the store's recall@k' the default beam (ef_search, nprobe) is chosen to reach at attach (default 0.99)."
    ),
    search: Path = typer.Option(None, "--search", help="Query embeddings to search the attached collection with (JSON lines out)."),
    top_k: int = typer.Option(10, help="With --search: results per query."),
    metadata: bool = typer.Option(False, "--metadata", help="With --search: also print each hit's metadata from the store."),
    exact: bool = typer.Option(
        False, "--exact", help="With --search: also search exactly (a full scan) and print the recall@k of the attached search against it."
    ),
    candidates: int = typer.Option(None, help="With --search: the first k' plain candidates per query (default 8 x top-k)."),
    max_candidates: int = typer.Option(None, help="With --search: the largest k' an uncertified query is widened to."),
    in_store: bool = typer.Option(
        False,
        "--in-store",
        help="With --search: the store ranks the first k' by the corrected score over the field --write-payload wrote, in one request "
        "(Qdrant, pgvector); hubless certifies what comes back.",
    ),
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
    if full and not update:
        raise InvalidInput("--full goes with --update (the full check of every vector)")
    if overwrite and (update or search is not None):
        raise InvalidInput("--overwrite goes with attaching (it replaces the sidecar in --out)")
    if search is not None:
        knobs = {"nprobe": nprobe, "ef_search": ef_search, "in_store": in_store}
        collection = AttachedCollection.open(source, out, **options)
        _search(collection, load_array(search), top_k, candidates, max_candidates, metadata, weight, knobs, exact)
        return
    if query_bank is None:
        raise InvalidInput("--query-bank is required to attach or update (the reference queries the biases are computed against)")
    qb = load_array(query_bank)
    gb = None if gallery_bank is None else load_array(gallery_bank)
    if update:
        report = update_sidecar(out, source, qb, gallery_bank=gb, full=full, batch=batch, **options)
        how = "every vector" if report["full"] else "a rotating sample of"
        typer.echo(
            f"updated {out}: {report['added']} added, {report['removed']} removed, {report['changed']} changed in place, "
            f"{report['items']} items; compared {how} {report['checked']} vectors with their digests; "
            f"read {report['read_items']} items' vectors ({report['bytes_read']} bytes read)"
        )
        if report["refit"]:
            typer.echo(f"refit: {report['refit']}")
        if report["payload_items"]:
            typer.echo(f"wrote the bias into the payload of {report['payload_items']} items")
        return
    attached = attach(
        source,
        qb,
        method,
        out=out,
        gallery_bank=gb,
        batch=batch,
        write_payload=payload_field if write_payload else False,
        overwrite=overwrite,
        beam_recall=beam_recall,
        **options,
    )
    info = attached.sidecar.info
    done = info["attached"]
    replaced = info.get("replaced")
    if replaced is not None:
        what = f"{replaced['spec']} attached to {replaced['source']}" if replaced["spec"] else "a damaged sidecar"
        typer.echo(f"replaced the sidecar in {out} ({what})")
    typer.echo(f"attached {attached.spec} to {source}: {attached.ntotal} items read in {done['seconds']} s; sidecar {out}")
    for note in info.get("notes") or []:
        typer.echo(f"note: {note}")
    beam = info.get("beam")
    if beam:
        value = f"{beam['value']:g} x k'" if beam["scaled"] else f"{beam['value']}"
        recall = beam["value_recall"]
        reached = "" if beam["met"] else f" (the widest tried; {beam['target']} not reached)"
        typer.echo(
            f"default {beam['knob']}: {value}, the store's recall@{beam['k']} {recall:.3f} on {beam['queries']} bank queries{reached}"
        )
    written = attached.sidecar.info.get("payload")
    if written:
        typer.echo(
            f"wrote the bias into payload field {', '.join(written['fields'])} of {written['items']} items in {written['seconds']} s"
        )


def _search(attached, queries, top_k, candidates, max_candidates, metadata, weight, knobs, exact) -> None:
    """``--search``: one JSON line per query (ids, scores, certified, exact, candidates, with
    ``--metadata`` each hit's record), the counts on stderr, with ``--exact`` the recall."""
    options: dict[str, float] = {k: v for k, v in knobs.items() if v is not None and v is not False}
    if weight is not None:
        options["weight"] = weight
    result = attached.search_certified(queries, top_k, candidates=candidates, max_candidates=max_candidates, metadata=metadata, **options)
    for i in range(result.n_queries):
        found = result.found[i]
        shown = result.ids[i][found].tolist()
        record = {
            "query": i,
            "ids": shown,
            "scores": [round(float(s), 6) for s in result.scores[i][found]],
            "certified": bool(result.certified[i]),
            "exact": bool(result.exact[i]),
            "candidates": int(result.candidates[i]),
        }
        if result.metadata is not None:
            record["metadata"] = [{"id": j, **result.metadata[j]} for j in shown]
        typer.echo(json.dumps(record, default=str))
    n = result.n_queries
    typer.echo(f"certified {int(result.certified.sum())} of {n} queries, exact {int(result.exact.sum())} of {n}", err=True)
    if exact:
        from hubless.attached.certified import recall_at_k

        want = attached.exact_search(queries, top_k) if weight is None else attached.exact_search(queries, top_k, weight=weight)
        typer.echo(f"recall@{top_k} against exact corrected search: {recall_at_k(result, want):.4f}", err=True)
