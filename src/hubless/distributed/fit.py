"""Fit corrections on Ray: bank statistics tile by tile, never gathering a bank on the driver.

    import hubless.distributed as hd
    nnn = hd.fit("nnn:alpha=0.75,k=16", "gallery_emb/", "bank_emb/", work_dir="fit-state/")

Each tile (a gallery shard against a bank shard, :mod:`hubless.distributed.plan`) is one Ray
task that reads its own rows from the sources (:mod:`hubless.storage.sources`) and returns
its partial statistics; the driver merges partials as they arrive (any order) and keeps each
finished tile in ``work_dir`` with its key and sha256 (:mod:`~hubless.storage.workfiles`),
so a rerun after a crash computes only the missing tiles, and recomputes, saying so, a kept tile
that is damaged or is not the tile (or of the fit) it should be. Ray
re-runs a task whose worker died (``max_retries``); an error in a task (a NaN in a shard, say)
stops the fit with that error, naming the shard. The merged statistics equal a single-machine
fit's (tested), and the correction is fitted from them with
:meth:`~hubless.Correction.fit` given ``statistics=`` (only the gallery and the merged statistics,
a few numbers per gallery item, come to the driver).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from hubless.corrections import Correction, make_correction, statistics_request
from hubless.distributed.cluster import check_address, connect, run_tasks
from hubless.distributed.plan import BANK_COLS, GALLERY_ROWS, Tile, plan_tiles
from hubless.distributed.tile_compute import compute_tile_streamed
from hubless.distributed.tile_merge import TileMerger
from hubless.distributed.tile_parts import TilePart
from hubless.engine.parallel import use_threads
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.errors import InvalidInput, MissingInput
from hubless.storage.sources import EmbeddingSource, open_source
from hubless.storage.workfiles import job_id, load_arrays, recomputing, save_arrays

__all__ = ["connect", "fit", "fit_many", "fit_statistics", "open_sources"]

#: Version of the work directory's layout (plan.json + tiles/*.npz, each tile with its key and
#: sha256). 3: a tile's log-sum-exps are kept as per-block sums (:class:`~hubless.distributed.tile_parts.LseBlocks`).
WORK_FORMAT = 3


def _tile_job(tile: Tile, gallery: EmbeddingSource, bank: EmbeddingSource, request, normalize: bool, threads: int):
    """One Ray task: the tile's partial statistics, its gallery rows read once and its bank
    items a piece at a time (padded to the engine's blocks,
    :func:`~hubless.distributed.tile_compute.compute_tile_streamed`), each checked as in-memory arrays
    are."""
    with use_threads(threads):  # the engine's threads = the task's CPUs (the environment is left alone)
        return compute_tile_streamed(
            tile,
            lambda a, b: gallery.read(a, b, normalize=normalize),
            lambda a, b: bank.read(a, b, normalize=normalize),
            request,
            gallery.n_rows,
            bank.n_rows,
        ).to_arrays()


def _fingerprint(request: StatisticsRequest, normalize: bool, sources: dict, tiles: Sequence[Tile]) -> dict:
    return {
        "format": WORK_FORMAT,
        "request": repr(request),
        "normalize": bool(normalize),
        "sources": {name: None if s is None else s.fingerprint() for name, s in sources.items()},
        "tiles": hashlib.sha256("\n".join(t.key for t in tiles).encode()).hexdigest(),
    }


def _work_dir(work_dir, fingerprint: dict) -> tuple[Path, str] | None:
    """The work directory of this fit and the fit's id (kept tiles carry it): ``plan.json``
    holds the fit's description; a directory holding another fit's is refused, a damaged
    ``plan.json`` or one of an older work format is rewritten (each tile is then checked against
    this fit on its own)."""
    if work_dir is None:
        return None
    from hubless._atomic import write_json

    path = Path(work_dir)
    plan_file = path / "plan.json"
    wanted = json.loads(json.dumps(fingerprint))
    if plan_file.exists():
        try:
            kept = json.loads(plan_file.read_text())
        except (OSError, ValueError):
            recomputing(plan_file, "is damaged (unreadable JSON); each kept tile is checked against this fit")
            kept = None
            write_json(plan_file, fingerprint)
        if isinstance(kept, dict) and kept.get("format") != WORK_FORMAT:  # an older hubless's tiles: none can be reused
            recomputing(plan_file, f"is of work format {kept.get('format')}, not {WORK_FORMAT}; every kept tile is recomputed")
            kept = None
            write_json(plan_file, fingerprint)
        if kept is not None and kept != wanted:
            raise InvalidInput(
                f"{path} holds tiles of another fit (other data, methods or tile sizes): pass a new work_dir or delete {path}"
            )
    else:
        write_json(plan_file, fingerprint)
    (path / "tiles").mkdir(parents=True, exist_ok=True)
    return path, job_id(wanted)


def _kept_tile(state: tuple[Path, str] | None, tile: Tile) -> TilePart | None:
    """A finished tile kept in the work dir, if it is intact and is this tile of this fit (else
    it is recomputed, saying why)."""
    if state is None:
        return None
    path = state[0] / "tiles" / f"{tile.key}.npz"
    arrays, why = load_arrays(path, {"tile": tile.key, "fit": state[1]})
    if arrays is None:
        if why:
            recomputing(path, why)
        return None
    return TilePart.from_arrays(arrays)


def _save_tile(state: tuple[Path, str], tile: Tile, arrays: dict) -> None:
    save_arrays(state[0] / "tiles" / f"{tile.key}.npz", arrays, {"tile": tile.key, "fit": state[1]})


def fit_statistics(
    request: StatisticsRequest,
    gallery,
    query_bank=None,
    gallery_bank=None,
    *,
    normalize: bool = True,
    address: str | None = None,
    workers: int | None = None,
    gallery_rows: int | Sequence[int] = GALLERY_ROWS,
    bank_cols: int | Sequence[int] = BANK_COLS,
    work_dir: str | os.PathLike | None = None,
    max_retries: int = 3,
    progress: bool | None = None,
) -> BankStatistics:
    """The bank statistics in ``request`` of the ``gallery`` source against the bank sources,
    computed on Ray tile by tile (see the module docstring).

    Sources: folders, globs or lists of ``.npy`` / parquet shards, or clip-retrieval
    ``img_emb`` / ``text_emb`` folders (:func:`~hubless.storage.sources.open_source`).
    ``workers``: tiles computed at once, each task taking an equal share of the cluster's CPUs
    (default: one CPU per task). ``gallery_rows`` / ``bank_cols``: tile sizes, or explicit cut
    points. ``work_dir``: keep finished tiles there and reuse them on a rerun.
    """
    return _fit_statistics(
        request,
        gallery,
        query_bank,
        gallery_bank,
        normalize=normalize,
        address=address,
        workers=workers,
        gallery_rows=gallery_rows,
        bank_cols=bank_cols,
        work_dir=work_dir,
        max_retries=max_retries,
        progress=progress,
    )


def _fit_statistics(
    request: StatisticsRequest,
    gallery,
    query_bank=None,
    gallery_bank=None,
    *,
    normalize: bool = True,
    address: str | None = None,
    workers: int | None = None,
    gallery_rows: int | Sequence[int] = GALLERY_ROWS,
    bank_cols: int | Sequence[int] = BANK_COLS,
    work_dir: str | os.PathLike | None = None,
    max_retries: int = 3,
    progress: bool | None = None,
    sink=None,
) -> BankStatistics:
    """:func:`fit_statistics`; with ``sink``, each finished gallery shard's per-item statistics
    go to it instead of staying on the driver (:class:`~hubless.distributed.tile_merge.TileMerger`)."""
    from hubless.progress import progress_bar

    check_address(address)
    sources = open_sources(gallery, query_bank, gallery_bank)
    g, qb, gb = sources["gallery"], sources["query_bank"], sources["gallery_bank"]
    assert g is not None  # open_sources always opens the gallery
    tiles = plan_tiles(
        request,
        g.n_rows,
        None if qb is None else qb.n_rows,
        None if gb is None else gb.n_rows,
        gallery_rows=gallery_rows,
        bank_cols=bank_cols,
    )
    merger = TileMerger(tiles, request, g.n_rows, g.dim, sink=sink)
    state = _work_dir(work_dir, _fingerprint(request, normalize, sources, tiles))
    todo = []
    for tile in tiles:
        kept = _kept_tile(state, tile)
        if kept is None:
            todo.append(tile)
        else:
            merger.add(tile, kept)
    if todo:
        ray = connect(address)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        per_task = max(1, cpus // workers) if workers else 1
        job = ray.remote(_tile_job).options(num_cpus=per_task, max_retries=max_retries)
        # the sources once in the object store (a 10^9-item source lists thousands of shards), not in every task's arguments
        g_ref, bank_of = ray.put(g), {"query": None if qb is None else ray.put(qb), "gallery": None if gb is None else ray.put(gb)}
        bar = progress_bar(None, progress, total=len(tiles), initial=len(tiles) - len(todo), desc="tiles", unit="tiles")

        def merge(tile: Tile, arrays: dict) -> None:
            if state is not None:
                _save_tile(state, tile, arrays)
            merger.add(tile, TilePart.from_arrays(arrays))

        try:
            run_tasks(
                ray,
                lambda t: job.remote(t, g_ref, bank_of[t.side], request, normalize, per_task),
                todo,
                merge,
                window=2 * max(1, cpus // per_task),  # every CPU busy, a result waiting for each
                bar=bar,
            )
        finally:
            bar.close()
    return merger.result()


def open_sources(gallery, query_bank=None, gallery_bank=None) -> dict[str, EmbeddingSource | None]:
    """The gallery and bank sources, opened (headers read and checked, see
    :mod:`~hubless.storage.sources`) and named as the in-memory checks name them; a bank of
    another dimension than the gallery is refused here, before any work."""
    g = open_source(gallery, label="gallery")
    out: dict[str, EmbeddingSource | None] = {"gallery": g}
    for name, spec in (("query_bank", query_bank), ("gallery_bank", gallery_bank)):
        src = out[name] = None if spec is None else open_source(spec, label=name)
        if src is not None and src.dim != g.dim:
            raise InvalidInput(
                f"{name} has dimension {src.dim} but the gallery has dimension {g.dim}; all embeddings must come from the same model "
                f"({src.shards[0].path} and {g.shards[0].path})"
            )
    return out


def _banks_for(corrections: Sequence[Correction], query_bank, gallery_bank):
    needing = [c for c in corrections if c.needs_query_bank]
    if needing and query_bank is None:
        raise MissingInput("query_bank", f"{type(needing[0]).__name__} needs a query bank (reference queries): pass {{arg}}")
    requiring = [c for c in corrections if c.gallery_bank_use == "required"]
    if requiring and gallery_bank is None:
        raise MissingInput("gallery_bank", f"{type(requiring[0]).__name__} needs a gallery bank: pass {{arg}}")
    qb = query_bank if needing else None
    gb = gallery_bank if any(c.gallery_bank_use != "ignored" for c in corrections) else None
    return qb, gb


def fit_many(methods: Sequence[Correction | str], gallery, query_bank=None, gallery_bank=None, **options) -> list[Correction]:
    """Fit several corrections from one distributed pass (their requests merged, as
    :func:`hubless.fit_many` does on one machine); ``options`` as :func:`fit_statistics`."""
    corrections = [make_correction(m) for m in methods]
    if len({bool(c.normalize) for c in corrections}) > 1:
        raise InvalidInput("corrections fitted together must share one normalize setting")
    request = statistics_request(corrections)
    qb, gb = _banks_for(corrections, query_bank, gallery_bank)
    sources = open_sources(gallery, qb, gb)
    source = sources["gallery"]
    assert source is not None  # open_sources always opens the gallery
    sizes = [None if s is None else s.n_rows for s in (sources["query_bank"], sources["gallery_bank"])]
    for c in corrections:
        c.check_sizes(source.n_rows, *sizes)
    normalize = corrections[0].normalize
    stats = fit_statistics(request, source, sources["query_bank"], sources["gallery_bank"], normalize=normalize, **options)
    rows = source.read(0, source.n_rows, normalize=normalize)
    return [c.fit(rows, statistics=stats) for c in corrections]


def fit(method: Correction | str, gallery, query_bank=None, gallery_bank=None, **options) -> Correction:
    """A correction (object or spec such as ``"nnn:alpha=0.75,k=16"``) fitted on Ray; equal to
    ``method.fit(gallery, query_bank, gallery_bank)`` on one machine. ``options``: see
    :func:`fit_statistics` (``address``, ``workers``, ``work_dir``, tile sizes, ``progress``)."""
    return fit_many([method], gallery, query_bank, gallery_bank, **options)[0]
