"""Filters on a live index: what a selective filtered search costs against the unfiltered exact
search, with and without scalar indexes, and what a removal by filter writes. One run, one table.

    .venv/bin/python benchmarks/index_filters.py [--n 1000000] [--dim 128] [--delete-n 100000] [--queries 100]

* Search: an ``--n`` x ``--dim`` Flat index (NNN k=16 over a 1,000-query bank) with metadata
  ``bucket`` (int, ``i % 1000``) and ``tag`` (string, ``"t" + i % 1000``): a filter on either
  matches 0.1% of the items. p50 over repeats of a batch of ``--queries`` queries and of one
  query: the unfiltered exact search, and the filtered one (a) on a version whose filter mask is
  cached (repeated searches), (b) on a new version each time (a 1-row add before each search:
  the mask is made again, from the kept scalar index: O(matches)) and (c) as (b) with scalar
  indexes off (every value compared: O(n)). A filter matching this few items is searched by
  gathering the matching rows and one product (gather + GEMM over the matches).
* Delete by filter: a ``--delete-n`` x ``--dim`` index saved; ``remove(where={"bucket100": k})``
  removes 1% of its items; the bytes of the files the write added or changed, against the
  index's size.

Floors (issue 38): a filtered search matching 0.1% of 1M x 128 costs <= 0.05x the unfiltered
exact search; a delete by filter of 1% of 100k items writes < 1% of the index.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table  # noqa: E402


def unit_rows(rng, n: int, d: int) -> np.ndarray:
    out = np.empty((n, d), np.float32)
    for s in range(0, n, 100_000):  # bounded temporaries
        x = rng.standard_normal((min(100_000, n - s), d)).astype(np.float32)
        out[s : s + x.shape[0]] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def files_state(folder: Path) -> dict:
    return {str(f.relative_to(folder)): (f.stat().st_size, f.stat().st_mtime_ns) for f in folder.rglob("*") if f.is_file()}


def p50(values) -> float:
    return float(np.median(values))


def _metadata(n: int):
    import pyarrow as pa

    i = np.arange(n)
    return pa.table(
        {"bucket": pa.array(i % 1000), "bucket100": pa.array(i % 100), "tag": pa.array(np.char.add("t", (i % 1000).astype(str)))}
    )


def filter_rows(n: int, dim: int, delete_n: int, n_queries: int, repeats: int, work: Path) -> list[tuple[str, str, str]]:
    """The table rows of this benchmark (also run by ``index_writes.py``)."""
    import hubless
    from hubless.index import filters as filters_module

    rng = np.random.default_rng(0)
    gallery, bank = unit_rows(rng, n, dim), unit_rows(rng, 1000, dim)
    queries, extra = unit_rows(rng, n_queries, dim), unit_rows(rng, 16 * repeats + 16, dim)
    t0 = time.perf_counter()
    index = hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=16", "Flat", metadata=_metadata(n))
    print(f"built {n:,} x {dim} Flat with metadata in {time.perf_counter() - t0:.1f} s")
    del gallery
    results: dict[str, float] = {}
    used = iter(range(extra.shape[0]))

    def timed(batch, where, fresh: bool) -> float:
        if fresh:  # a new version: its filter masks are made again
            k = next(used)
            index.add(extra[k : k + 1], [{"bucket": -1, "bucket100": -1, "tag": "new"}])
        t0 = time.perf_counter()
        index.search(batch, 10, where=where)
        return time.perf_counter() - t0

    for label, batch in ((f"{n_queries} queries", queries), ("1 query", queries[:1])):
        index.search(batch, 10)  # warm
        results[f"exact, {label}"] = p50([timed(batch, None, False) for _ in range(repeats)])
        for key, where in (("int", {"bucket": 7}), ("string", {"tag": "t7"})):
            filters_module.SCALAR_INDEX_MIN_ROWS = 16384
            timed(batch, where, True), timed(batch, where, True)  # the scalar index is made at the second filter
            results[f"{key} cached, {label}"] = p50([timed(batch, where, False) for _ in range(repeats)])
            results[f"{key} new version, {label}"] = p50([timed(batch, where, True) for _ in range(max(3, repeats // 3))])
            filters_module.SCALAR_INDEX_MIN_ROWS = None
            results[f"{key} no index, {label}"] = p50([timed(batch, where, True) for _ in range(max(3, repeats // 3))])
            filters_module.SCALAR_INDEX_MIN_ROWS = 16384
        print("  " + ", ".join(f"{k}: {1000 * v:.2f} ms" for k, v in results.items() if k.endswith(label)))

    small = hubless.Index.build(unit_rows(rng, delete_n, dim), bank, "nnn:alpha=0.75,k=16", "Flat", metadata=_metadata(delete_n))
    path = work / "delete"
    small.save(path)
    live = hubless.Index.open(path)
    before = files_state(path)
    size = sum(s for s, _ in before.values())
    t0 = time.perf_counter()
    removed = live.remove(where={"bucket100": 42})
    seconds = time.perf_counter() - t0
    after = files_state(path)
    written = sum(s for name, (s, m) in after.items() if before.get(name) != (s, m))
    print(f"  delete by filter: {removed.size:,} of {delete_n:,} items in {1000 * seconds:.0f} ms, {written:,} of {size:,} bytes written")
    shutil.rmtree(path)

    rows = []
    for label in (f"{n_queries} queries", "1 query"):
        exact = results[f"exact, {label}"]
        rows.append((f"exact search, {label}: p50 (ms)", f"{1000 * exact:.1f}", ""))
        for key in ("int", "string"):
            cached, fresh, plain = (results[f"{key} {what}, {label}"] for what in ("cached", "new version", "no index"))
            floor = "<= 0.05x" if key == "int" else ""
            rows.append((f"0.1% filter ({key}), {label}, new version / exact", f"{fresh / exact:.4f}x ({1000 * fresh:.2f} ms)", floor))
            rows.append((f"0.1% filter ({key}), {label}, cached mask / exact", f"{cached / exact:.4f}x", ""))
            rows.append((f"0.1% filter ({key}), {label}, no scalar index / exact", f"{plain / exact:.4f}x", ""))
    rows.append(("delete by filter of 1% of the items: share of the index written", f"{100 * written / size:.3f}%", "< 1%"))
    rows.append(("delete by filter of 1%: bytes written, ms", f"{written:,}, {1000 * seconds:.0f}", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--delete-n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="index-filters-", dir=args.workdir))
    print(f"load average at the start: {'/'.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    try:
        rows = filter_rows(args.n, args.dim, args.delete_n, args.queries, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    full = (args.n, args.dim, args.delete_n) == (1_000_000, 128, 100_000)
    print_table(rows, full_size=full, size="1M x 128 search, 100k x 128 delete")


if __name__ == "__main__":
    main()
