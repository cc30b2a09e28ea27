"""``hubless index build|info|add|remove|update-metadata|get|compact|verify|calibrate|versions|restore``:
serve a correction from FAISS, write to it live (stable ids, one segment per write), remove or update
items by id or by a metadata filter. ``hubless search`` is in :mod:`hubless.cli.search_command`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import NORMALIZE_HELP, friendly_errors, load, parse_where, warn_coverage, wide_console
from hubless.errors import AlreadyExists, InvalidInput
from hubless.progress import stage

app = typer.Typer(help="Build, inspect and grow corrected FAISS indexes.", no_args_is_help=True)


def _read_metadata(path: Path | None):
    """Item metadata records (see :func:`hubless.inputs.read_records`); None passes through."""
    from hubless.inputs import read_records

    return None if path is None else read_records(path)


@app.command("build")
@friendly_errors
def build_command(
    gallery: Path = typer.Option(..., help="Gallery embeddings (.npy/.npz)."),
    out: Path = typer.Option(..., help="Directory to write the index to."),
    query_bank: Path = typer.Option(None, help="Reference queries the correction is fitted on."),
    gallery_bank: Path = typer.Option(None, help="Reference gallery-modality items (DualIS/DualDIS, DN)."),
    method: str = typer.Option("nnn:alpha=0.75,k=16", help="Additive correction spec (not gc)."),
    factory: str = typer.Option(
        None, help="FAISS factory string: Flat, IVF1024,Flat, HNSW32, IVF1024,PQ64 ... (default from the gallery size)."
    ),
    metadata: Path = typer.Option(None, help="Per-item metadata: .parquet, .csv, .json (or an embed .meta.json), .txt."),
    ids: str = typer.Option(None, help="Item ids (int64 >= 0, e.g. database keys): 3,17,42 or a .npy/.txt file. Default 0, 1, ..."),
    model: str = typer.Option(None, help="Name of the model that made the embeddings (recorded)."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
    overwrite: bool = typer.Option(False, help="Replace an existing index directory."),
    target_recall: float = typer.Option(
        None,
        help="Choose the factory (unless --factory) and nprobe / ef_search for this recall@10 of the exact corrected top 10, "
        "measured on held-out query-bank queries only (recorded in `index info`).",
    ),
    max_memory: str = typer.Option(
        None, help="With --target-recall: most bytes the FAISS structure may take (2GB, 512MiB, ...); IVF-PQ when nothing else fits."
    ),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    ray: bool = typer.Option(
        False, "--ray", help="Fit and fill on Ray: --gallery/--query-bank may be folders or globs of .npy/parquet shards."
    ),
    address: str = typer.Option(None, help="Ray cluster to run on (ray://host:10001, auto); implies --ray. Default: a local Ray."),
    work_dir: Path = typer.Option(None, help="With --ray: keep finished tiles here; a rerun computes only the missing ones."),
) -> None:
    """Fit the correction on the banks, index each item with its bias appended, save atomically."""
    from hubless.errors import check_available
    from hubless.index import Index

    if out.exists() and not overwrite and not _empty_dir(out):
        raise AlreadyExists(f"{out} exists; pass --overwrite to replace it")
    if max_memory is not None and target_recall is None:
        raise typer.BadParameter("--max-memory bounds what --target-recall may choose: pass --target-recall too")
    if target_recall is not None:
        from hubless._validation import check_target_recall
        from hubless.index.tuner import parse_size

        check_target_recall(target_recall)
        parse_size(max_memory)
        if query_bank is None:
            raise typer.BadParameter("--target-recall is measured on the query bank: pass --query-bank")
    if metadata is not None:  # saved as parquet: say so before the work, not after it
        check_available("pyarrow", "saving item metadata (--metadata)", "index")
    item_ids = None
    if ids is not None:
        from hubless.inputs import read_ids

        item_ids = read_ids(ids)
    if ray or address:
        if item_ids is not None:
            raise InvalidInput("--ids with --ray is not supported: build, then add the items with their ids (hubless index add --upsert)")
        if max_memory is not None:
            raise InvalidInput(
                "--max-memory with --ray is not supported: the factory is yours (--factory); --target-recall chooses its knob"
            )
        # written into out by the tasks (the driver holds no gallery); loaded (mapped) only to calibrate
        built = _build_on_ray(
            gallery,
            query_bank,
            gallery_bank,
            method,
            factory,
            normalize,
            metadata,
            model,
            address,
            work_dir,
            progress,
            out,
            overwrite,
            load=target_recall is not None,
        )
        if target_recall is not None:
            result = built.calibrate(target_recall=target_recall)
            _print_calibration(result)
            built.config.tuning = {
                "target_recall": target_recall,
                "factory": built.factory,
                **{k: result[k] for k in ("param", "value", "recall", "reached")},
                "queries": {"source": "query bank"},
            }
            built.save(out, overwrite=True)  # the manifest only: the items are written already
        from hubless.index.pointer import read_manifest

        manifest, _ = read_manifest(out)
        config = manifest["config"]
        typer.echo(
            f"built Index({manifest['method']!r}, factory={config['factory']!r}, n_items={manifest['n_items']}) "
            f"in {config['build_seconds']:.1f}s -> {out}"
        )
        return
    else:
        if metadata is not None:
            from hubless.inputs import check_embedding_meta

            check_embedding_meta(metadata, gallery)
        g = load(gallery, "gallery", normalize=normalize)
        qb = load(query_bank, "query bank", normalize=normalize, dim=g.shape[1])
        gb = load(gallery_bank, "gallery bank", normalize=normalize, dim=g.shape[1])
        corr, statistics = _fit_with_coverage(g, qb, gb, method, factory, normalize, progress)
        index = Index.build(
            g,
            qb,
            corr,
            factory,
            gallery_bank=gb,
            metadata=_read_metadata(metadata),
            model=model,
            progress=progress,
            statistics=statistics,
            ids=item_ids,
            target_recall=target_recall,
            max_memory=max_memory,
        )
        if index.config.tuning is not None:
            _print_tuning(index.config.tuning)
    index.save(out, overwrite=overwrite)
    typer.echo(f"built {index!r} in {index.config.build_seconds:.1f}s -> {out}")


def _empty_dir(path: Path) -> bool:
    """An empty directory (e.g. made for the index beforehand): the build may write into it."""
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def _fit_with_coverage(g, qb, gb, method, factory, normalize, progress):
    """The correction and its bank statistics from one pass that also gives the bank's coverage
    (warned about when low, before anything is measured). Cheap checks first: a bad factory or a
    method an index cannot serve fails in a second (Index.build refuses the latter)."""
    from hubless.banks import coverage_report
    from hubless.corrections import fit_shared, make_correction
    from hubless.engine import StatisticsRequest
    from hubless.index.factory import check_factory

    corr = make_correction(method).set_params(normalize=normalize)
    if factory is not None:
        check_factory(factory, g.shape[0], g.shape[1] + 1)
    if qb is None or not corr.additive:
        return corr, None
    _, statistics = fit_shared([corr], g, qb, gb, also=StatisticsRequest(query_nearest=True), progress=progress)
    warn_coverage(coverage_report(statistics))
    return corr, statistics


def _build_on_ray(
    gallery, query_bank, gallery_bank, method, factory, normalize, metadata, model, address, work_dir, progress, out, overwrite, *, load
):
    """``index build --ray``: the distributed fit and fill, written into ``out`` by the tasks
    (sources are read by the tasks)."""
    import hubless.distributed as hd
    from hubless.corrections import make_correction

    corr = make_correction(method).set_params(normalize=normalize)
    return hd.build_index(
        corr,
        gallery,
        query_bank,
        factory,
        gallery_bank=gallery_bank,
        address=address,
        work_dir=work_dir,
        out=out,
        overwrite=overwrite,
        load=load,
        metadata=_read_metadata(metadata),
        model=model,
        progress=progress,
    )


@app.command("info")
@friendly_errors
def info_command(path: Path = typer.Argument(..., help="Index directory.")) -> None:
    """Describe a saved index: method, sizes, config, and how it is stored (base, segments)."""
    from hubless.index import Index

    index = Index.load(path, mmap=True)
    info = index.info().to_dict()
    tuning = info.pop("tuning", None)
    table = Table(title=str(path), show_header=False)
    for key, value in {**info, **index.storage()}.items():
        table.add_row(key, str(value))
    wide_console().print(table)
    if tuning:
        _print_tuning(tuning)


def _print_tuning(tuning: dict) -> None:
    """The tuner's candidates (hubless.index.tuner) and its choice."""
    candidates = tuning.get("candidates")
    if candidates:
        table = Table(title=f"candidates for recall@{tuning.get('top_k', 10)} >= {tuning['target_recall']} (measured on the query bank)")
        for column in ("factory", "knob", "recall", "p50 ms", "batch ms/query", "MB", "build s", "note"):
            table.add_column(column, justify="left" if column in ("factory", "note") else "right")
        for c in candidates:
            knob = "" if c.get("param") is None else f"{c['param']}={c['value']}"
            size = c.get("bytes", c.get("estimated_bytes", 0)) / 1e6
            cells = [c.get("recall"), c.get("p50_ms"), c.get("batch_ms_per_query")]
            table.add_row(
                c["factory"],
                knob,
                *("" if v is None else f"{v:.3f}" for v in cells),
                f"{size:.1f}",
                "" if "build_seconds" not in c else f"{c['build_seconds']:.1f}",
                c.get("skipped", ""),
            )
        wide_console().print(table)
    knob = "" if tuning.get("param") is None else f" {tuning['param']}={tuning['value']}"
    heldout = "" if "heldout_recall" not in tuning else f" ({tuning['heldout_recall']:.3f} on held-out bank queries)"
    if tuning["reached"]:
        typer.echo(f"chose {tuning['factory']}{knob}: recall {tuning['recall']:.3f} >= {tuning['target_recall']}{heldout}")
    else:
        typer.echo(
            f"no candidate reached {tuning['target_recall']}: kept the best, {tuning['factory']}{knob}, recall {tuning['recall']:.3f}{heldout}"
        )


def _shown_ids(ids) -> str:
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids[:10])) + (f", ... ({len(ids) - 10} more)" if len(ids) > 10 else "")


@app.command("add")
@friendly_errors
def add_command(
    path: Path = typer.Argument(..., help="Index directory (updated in place: one segment per write)."),
    embeddings: Path = typer.Option(None, help="New gallery items (.npy/.npz)."),
    metadata: Path = typer.Option(None, help="Their metadata (same formats as build)."),
    ids: str = typer.Option(None, help="Their ids (3,17,42 or a .npy/.txt file); default: assigned from the index's next id."),
    upsert: bool = typer.Option(False, "--upsert", help="Replace the items whose ids are present instead of refusing them."),
    query_bank: Path = typer.Option(None, help="New reference queries for the query bank (.npy/.npz): every bias is updated."),
    gallery_bank: Path = typer.Option(None, help="New reference items for the gallery bank (DualIS/DualDIS, DN)."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
) -> None:
    """Add items (biases from the stored banks; prints their ids) and/or bank items (every bias updated)."""
    from hubless.index import Index
    from hubless.inputs import read_ids

    if embeddings is None and query_bank is None and gallery_bank is None:
        raise typer.BadParameter("pass --embeddings (new items), --query-bank and/or --gallery-bank (new bank items)")
    if (ids is not None or upsert) and embeddings is None:
        raise typer.BadParameter("--ids and --upsert go with --embeddings")
    if upsert and ids is None:
        raise typer.BadParameter("--upsert needs --ids (the items to replace or add)")
    if metadata is not None:
        from hubless.errors import check_available

        check_available("pyarrow", "saving item metadata (--metadata)", "index")
    item_ids = None if ids is None else read_ids(ids)
    with Index.update(path, mmap=True) as index:  # locked from load to commit: concurrent adds never lose a batch
        normalize, dim = index.info()["normalize"], index.info()["dim"]
        if query_bank is not None:
            new_bank = load(query_bank, "query bank", normalize=normalize, dim=dim)
            index.add_query_bank(new_bank, progress=progress)
            typer.echo(f"added {new_bank.shape[0]} bank queries")
        if gallery_bank is not None:
            new_bank = load(gallery_bank, "gallery bank", normalize=normalize, dim=dim)
            index.add_gallery_bank(new_bank, progress=progress)
            typer.echo(f"added {new_bank.shape[0]} gallery-bank items")
        if embeddings is not None:
            if metadata is not None:
                from hubless.inputs import check_embedding_meta

                check_embedding_meta(metadata, embeddings)
            new = load(embeddings, "embeddings", normalize=normalize, dim=dim)
            records = _read_metadata(metadata)
            if upsert:
                added = index.upsert(item_ids, new, records, progress=progress)
                typer.echo(f"upserted {new.shape[0]} items: ids {_shown_ids(added)}")
            else:
                added = index.add(new, records, ids=item_ids, progress=progress)
                typer.echo(f"added {new.shape[0]} items: ids {_shown_ids(added)}")
    typer.echo(f"saved {index!r}")


@app.command("calibrate")
@friendly_errors
def calibrate_command(
    path: Path = typer.Argument(..., help="Index directory (updated in place, atomically)."),
    target_recall: float = typer.Option(0.95, help="Recall@K of the exact corrected top K to reach."),
    top_k: int = typer.Option(10, help="K of the recall."),
    queries: Path = typer.Option(None, help="Queries to measure on (.npy/.npz; default: the stored query bank). Never the test queries."),
    sample: int = typer.Option(1000, help="Queries sampled for the measurement."),
) -> None:
    """Choose nprobe (IVF) / ef_search (HNSW): the smallest power of two reaching the target recall."""
    from hubless.index import Index

    with stage(f"calibrating {path}", None), Index.update(path) as index:  # a search per knob value: seconds on large indexes
        q = None if queries is None else load(queries, "queries", normalize=index.correction.normalize, dim=index.correction.dim_)
        result = index.calibrate(q, target_recall=target_recall, top_k=top_k, sample=sample)
    _print_calibration(result)


def _print_calibration(result: dict) -> None:
    if result["param"] is None:
        typer.echo("exact index: nothing to calibrate (recall 1.0)")
        return
    table = Table(title=f"recall vs {result['param']}")
    table.add_column(result["param"], justify="right")
    table.add_column("recall", justify="right")
    for value, recall in result["curve"]:
        table.add_row(str(value), f"{recall:.3f}")
    wide_console().print(table)
    verdict = "reaches" if result["reached"] else "falls short of the target; the largest value tried is kept:"
    typer.echo(f"{result['param']} = {result['value']} {verdict} recall {result['recall']:.3f}")


def _chosen_items(ids: str | None, where: str | None, what: str):
    """The items a write acts on, given by exactly one of ``--ids`` (comma-separated or a
    .npy/.txt file) and ``--where`` (a JSON metadata filter): ``(ids, None)`` or
    ``(None, condition)``, both read before the index is opened."""
    from hubless.inputs import read_ids

    if (ids is None) == (where is None):
        raise typer.BadParameter(f"give --ids or --where (the items to {what}), one of them")
    return (None, parse_where(where)) if ids is None else (read_ids(ids), None)


@app.command("remove")
@friendly_errors
def remove_command(
    path: Path = typer.Argument(..., help="Index directory (updated in place: one segment per write)."),
    ids: str = typer.Option(None, help="Ids of the items to remove: comma-separated (3,17,42) or a .npy/.txt file of them."),
    where: str = typer.Option(
        None, help='Instead of --ids: remove every item matching this metadata filter (JSON, as search\'s --where): {"split": "old"}.'
    ),
) -> None:
    """Remove items by id (all or nothing: an unknown id removes none) or by a metadata filter; the other items' biases are kept."""
    from hubless.index import Index

    item_ids, condition = _chosen_items(ids, where, "remove")
    with Index.update(path, mmap=True) as index:
        removed = index.remove(item_ids) if condition is None else index.remove(where=condition)
    shown = "" if condition is None or not removed.size else f" (ids {_shown_ids(removed)})"
    typer.echo(f"removed {removed.size} items{shown}: {index!r}")


@app.command("update-metadata")
@friendly_errors
def update_metadata_command(
    path: Path = typer.Argument(..., help="Index directory (updated in place: one segment per write)."),
    ids: str = typer.Option(None, help="The items to change: comma-separated ids (3,17,42) or a .npy/.txt file of them."),
    where: str = typer.Option(None, help="Instead of --ids: every item matching this metadata filter (JSON, as search's --where)."),
    set_: str = typer.Option(None, "--set", help='Keys to set on every item, as a JSON object: {"split": "test", "year": 2024}.'),
    unset: list[str] = typer.Option(None, "--unset", help="A key to set to null (repeatable)."),
) -> None:
    """Set or unset metadata keys of items (by id or filter) without sending their embeddings again; types are checked as on add."""
    from hubless.index import Index

    item_ids, condition = _chosen_items(ids, where, "change")
    if set_ is None and not unset:
        raise typer.BadParameter("give --set and/or --unset (what to change)")
    values = None
    if set_ is not None:
        try:
            values = json.loads(set_)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f'--set must be a JSON object such as \'{{"split": "test"}}\': {exc.msg}') from None
        if not isinstance(values, dict) or not values:
            raise InvalidInput("--set must be a non-empty JSON object of keys and values")
    with Index.update(path, mmap=True) as index:
        changed = index.update_metadata(item_ids, where=condition, values=values, unset=list(unset or []) or None)
    shown = f": ids {_shown_ids(changed)}" if changed.size else ""
    typer.echo(f"updated the metadata of {changed.size} items{shown}")


@app.command("get")
@friendly_errors
def get_command(
    path: Path = typer.Argument(..., help="Index directory."),
    ids: str = typer.Option(..., help="Item ids: comma-separated (3,17,42) or a .npy/.txt file of them."),
    embeddings: bool = typer.Option(False, "--embeddings", help="Also print each item's embedding."),
) -> None:
    """Print items by id as JSON lines: id, metadata (and embedding)."""
    from hubless._atomic import to_json
    from hubless.index import Index
    from hubless.inputs import read_ids

    items = Index.load(path, mmap=True).get(read_ids(ids))
    for i, item_id in enumerate(items.ids):
        line = {"id": int(item_id), "metadata": None if items.metadata is None else items.metadata[i]}
        if embeddings:
            line["embedding"] = items.embeddings[i].tolist()
        typer.echo(to_json(line))


@app.command("compact")
@friendly_errors
def compact_command(path: Path = typer.Argument(..., help="Index directory (rewritten as a new base, atomically).")) -> None:
    """Fold every write into a new base of the live items (writes also do it past a threshold)."""
    from hubless.index import Index

    with stage(f"compacting {path}", None), Index.update(path, mmap=True) as index:  # a new base, its FAISS structure rebuilt
        before = index.storage()
        index.compact()
    after = index.storage()
    typer.echo(
        f"compacted {path}: {before['base_rows']} + {before['rows_since_base']} rows in {before['segments']} segments, "
        f"{before['removed_rows']} removed -> {after['base_rows']} rows"
    )


@app.command("versions")
@friendly_errors
def versions_command(
    path: Path = typer.Argument(..., help="Index directory."),
    keep: int = typer.Option(None, help="Keep this many versions from now on (the current one included; 0: none besides it)."),
) -> None:
    """List the versions the index keeps (search one with `hubless search --as-of`, restore one with `hubless index restore`)."""
    from hubless.index import Index

    if keep is not None:
        with Index.update(path, mmap=True) as index:
            index.set_keep_versions(keep)
        typer.echo(f"{path} keeps {keep} versions")
    table = Table(title=f"versions of {path}")
    for column in ("version", "items", "rows", "segments", "base", "committed", ""):
        table.add_column(column, justify="right" if column in ("version", "items", "rows", "segments") else "left")
    for v in Index.versions(path):
        if v.get("damaged"):
            table.add_row(str(v["version"]), "", "", "", "", str(v["committed"]), "damaged record")
            continue
        table.add_row(
            str(v["version"]),
            str(v["items"]),
            str(v["rows"]),
            str(v["segments"]),
            v["base"],
            str(v["committed"]),
            "current" if v["current"] else "",
        )
    wide_console().print(table)


@app.command("restore")
@friendly_errors
def restore_command(
    path: Path = typer.Argument(..., help="Index directory (a new version is committed, atomically)."),
    version: int = typer.Option(..., help="The kept version to make current again (see `hubless index versions`)."),
) -> None:
    """Make a kept version current again, as a new version (ids assigned since are never assigned again)."""
    from hubless.index import Index

    number = Index.restore(path, version)
    typer.echo(f"restored version {version} of {path} as version {number}")


@app.command("verify")
@friendly_errors
def verify_command(path: Path = typer.Argument(..., help="Index directory.")) -> None:
    """Check what a load and a search read: every file against the sha256 and size recorded when it
    was written (a plain load checks every file it reads; a memory-mapped load skips the mapped
    ones), then the FAISS structure as a search reads it (its lists in the file, their ids, a search)."""
    from hubless.index.integrity import verify

    with stage(f"verifying {path}", None):  # reading every file: seconds to minutes
        result = verify(path)
    if result["files"] is None:
        typer.echo(f"ok: {path} (format {result['format']}: every file verified by the load), {result['items']} items")
    else:
        faiss_text = "" if not result.get("faiss") else f"; FAISS {result['faiss']} searched"
        typer.echo(f"ok: {path}: {result['files']} files, {result['bytes']:,} bytes verified; {result['items']} items{faiss_text}")
