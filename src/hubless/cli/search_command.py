"""``hubless search``: the top k of queries (embeddings, texts, images) in a saved index, an
attached collection or a store it was exported to (``lancedb://``, ``postgresql://``,
``qdrant://``, ...), all through :class:`hubless.search.Searcher` (a store through
:class:`hubless.search.store_index.StoreIndex`, i.e. :func:`hubless.export.search`): the model
rule, the top-k rule and the refusals are the library's; printed as a table or JSON lines."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import friendly_errors, load, parse_where, wide_console
from hubless.errors import InvalidInput
from hubless.progress import stage


@friendly_errors
def search_command(
    path: str = typer.Argument(
        ..., help="Index directory, or a store written by `hubless export` (lancedb://, postgresql://, qdrant://, qdrant+http://)."
    ),
    queries: Path = typer.Option(None, help="Query embeddings (.npy/.npz or a clip-retrieval folder)."),
    text: list[str] = typer.Option(None, "--text", help="A text query (repeatable), encoded with the index's model (or --model)."),
    texts: Path = typer.Option(None, help="Text queries, one per line (.txt) or a .json list, encoded with the index's model."),
    image: list[Path] = typer.Option(None, "--image", help="An image file as query (repeatable), encoded with the index's model."),
    model: str = typer.Option(
        None, help="Model for --text/--texts/--image (default: the model the index records; must be the same model)."
    ),
    allow_model_mismatch: bool = typer.Option(
        False, "--allow-model-mismatch", help="Encode queries with --model even though the index records another model."
    ),
    device: str = typer.Option(None, help="Device for --model: cpu, cuda, ... (default: CUDA when available)."),
    top_k: int = typer.Option(10, help="Results per query."),
    weight: float = typer.Option(None, help="The correction's weight for this search (NNN's alpha, DN's lambda); default: the index's."),
    alpha: float = typer.Option(None, hidden=True, help="Deprecated name of --weight."),
    nprobe: int = typer.Option(
        None, help="IVF lists to visit (default: the index's; on a store with an IVF index, its partitions probed)."
    ),
    ef_search: int = typer.Option(None, help="HNSW search breadth (default: the index's; on a store with an HNSW index, its ef)."),
    rescore: bool = typer.Option(None, "--rescore/--no-rescore", help="Exact re-scoring of ANN candidates (default: on for ANN indexes)."),
    target_recall: float = typer.Option(None, help="On a store with an ANN index: the knob measured at export to reach this recall@10."),
    where: str = typer.Option(
        None, help='Metadata filter as JSON: {"split": "test", "year": {"gte": 2020}, "tag": {"in": ["a", "b"]}} (docs/live-index.md).'
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines: one object per query with ids, scores and metadata."),
    as_of: int = typer.Option(None, "--as-of", help="Search this kept version of the index (see `hubless index versions`)."),
    rerank: str = typer.Option(None, help="Rerank the top --rerank-k with this cross-encoder (BLIP ITM or CrossEncoder name/folder)."),
    rerank_k: int = typer.Option(20, help="Candidates per query given to the reranker."),
    fusion: str = typer.Option(None, help="Score fusion: add or norm_add (default: plain rerank)."),
    fusion_weight: float = typer.Option(None, help="Weight of the bi-encoder score in fusion (default 0.1)."),
    lam: float = typer.Option(None, hidden=True, help="Deprecated name of --fusion-weight."),
    query_items: Path = typer.Option(None, help="With --rerank: the query texts / image paths (.txt, .json or an embed .meta.json)."),
    item_column: str = typer.Option(
        None, help="With --rerank: the metadata column holding each gallery item's path or text (default: path, text, caption or item)."
    ),
) -> None:
    """Search a saved index (or a store it was exported to); scores are the method's own, ids the items' ids."""
    from hubless._validation import exactly_one
    from hubless.cli._common import deprecated_flag

    weight = deprecated_flag(weight, alpha, "--alpha", "--weight")
    fusion_weight = deprecated_flag(fusion_weight, lam, "--lam", "--fusion-weight")
    fusion_weight = 0.1 if fusion_weight is None else fusion_weight
    exactly_one({"--queries": queries, "--text": text, "--texts": texts, "--image": image})
    if queries is not None and model is not None:
        raise typer.BadParameter("--model encodes --text/--texts/--image queries; --queries are already embeddings")
    items = _query_items(text, texts, image)
    condition = parse_where(where)
    from hubless.search import Searcher
    from hubless.search.store_index import as_store

    store = as_store(path, show_location=True)  # a store written by hubless export (a URI), else None: an index or attached sidecar
    sources = {Path(path).name: Path(path)} if store is None else {store.table: store}
    # a store is not reranked (its search refuses rerank=True): no cross-encoder is loaded for it
    searcher = Searcher(
        sources,
        model=model,
        device=device,
        allow_model_mismatch=allow_model_mismatch,
        reranker=rerank if store is None else None,
        rerank_k=rerank_k,
        fusion=fusion,
        fusion_weight=fusion_weight,
        rerank_column=item_column,
    )
    name = searcher.name()
    index = searcher.index() if as_of is None else searcher.version(name, as_of)  # that kept version, read only
    info = index.info()
    embeddings = None if queries is None else load(queries, "queries", normalize=info["normalize"], dim=info["dim"])
    reranked_items = None
    if rerank:
        from hubless.inputs import read_items

        reranked_items = read_items(query_items) if query_items is not None else items
        if reranked_items is None:
            raise InvalidInput("--rerank needs --query-items (the query texts or image paths the cross-encoder reads) with --queries")
    searching = (
        contextlib.nullcontext() if rerank else stage("searching" if queries is not None else "encoding the queries and searching", None)
    )
    with searching:  # a spinner on a terminal (a model's first load takes seconds); a reranker shows its own bar
        result = searcher.search(
            name,
            embeddings=embeddings,
            texts=items if (text or texts) else None,
            images=items if image else None,
            top_k=top_k,
            weight=weight,
            rerank=bool(rerank),
            query_items=reranked_items,
            nprobe=nprobe,
            ef_search=ef_search,
            rescore=rescore,
            where=condition,
            version=as_of,
            target_recall=target_recall,  # a store's own option (hubless.export.search); refused on an index
        )
    title = (
        f"{store.shown_uri}: top {top_k}"  # credentials in the URI are never printed
        if store is not None
        else f"{path} ({info['method']}, {index.config.factory}, {index.ntotal} items): top {top_k}"
    )
    _print_records(title, result.records(), with_metadata=result.metadata is not None, as_json=as_json)


def _query_items(text, texts, image) -> list[str] | None:
    """The text queries (from --text or --texts) or image paths (--image); None for --queries."""
    from hubless.inputs import read_items

    if text:
        return list(text)
    if texts is not None:
        return [t for t in read_items(texts) if t.strip()]
    if image:
        return [str(p) for p in image]
    return None


def _print_records(title: str, records: list[dict], *, with_metadata: bool, as_json: bool) -> None:
    """:meth:`hubless.Hits.records` (the service's answer too) as JSON lines (every query) or a
    table (the first 20): the found hits only, each with its metadata when the index has some."""
    if as_json:
        from hubless._atomic import to_json

        for record in records:
            typer.echo(to_json(record))
        return
    table = Table()
    for col in ("query", "rank", "id", "score"):
        table.add_column(col, justify="right")
    if with_metadata:
        table.add_column("metadata")
    for record in records[:20]:
        for rank, hit in enumerate(record["hits"], start=1):
            text = record.get("text")
            label = f"{record['query']}: {text[:40]}" if text is not None and rank == 1 else str(record["query"])
            score = "" if hit["score"] is None else f"{hit['score']:.4f}"
            row = [label, str(rank), str(hit["id"]), score]
            if with_metadata:
                row.append(json.dumps(hit.get("metadata"))[:80])
            table.add_row(*row)
    console = wide_console()
    console.print(title, highlight=False, markup=False)
    console.print(table)
    if len(records) > 20:
        typer.echo(f"(first 20 of {len(records)} queries shown; use --json for all)")
