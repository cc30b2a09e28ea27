"""Attaching a correction to a collection the user already has (issues 42 and 52), one run.

    .venv/bin/python benchmarks/attach.py [--n 10000] [--dim 128] [--queries 1000] [--stores faiss,faiss-flat,lancedb,qdrant]

**Part A, per store** (issue 42's floors, with issue 52's two promises). Each store holds a
*plain* collection written as a user would (their ids: a shuffled, sparse range, a third of
them negative where the store takes them; never through hubless): a FAISS
``IndexIDMap2(IndexHNSWFlat(d, 32))`` file and a FAISS ``IndexIDMap2(IndexFlatIP)`` file, an
embedded LanceDB table with an IVF_FLAT index (dot), a shard of Qdrant's in-process engine with
its HNSW index (Dot). The data is hubless's hub-prone synthetic set; the correction NNN (alpha
0.75, k 16) against a 5,000-query bank. Per store:

* recall@10 of the attached search against exact corrected search (the correction fitted in
  memory over the items in id order, ties to the lower id), next to the store's own plain
  recall@10 against exact plain search (floor: >= plain - 0.5 pt);
* the shares certified and exact, the answers claimed exact that differ from exact corrected
  search (floor: 0) and the certified ones that do (through an ANN index certified is relative
  to its plain ranking); LanceDB and Qdrant also searched with their exact option (``exact``);
* the default beam attach chose from the store's recall@80 measured on 32 bank queries (the points its bisection measured), what
  it costs: one query's p50 at that beam and at the old default (FAISS 2 k', Qdrant 4 k');
* p50 latency of one query: attached vs the store's own plain top-10 query at its defaults
  (FAISS on one thread: its OpenMP threads only add waiting to a one-query call on a loaded
  machine) and vs the store's top-k' at the attached search's beam;
* attach time against an in-process fit on the same arrays plus the store's read time (a full
  scan of ids and vectors), each timed three times, interleaved, medians (floor: <= 1.5x);
* an update after adding 1% of items: the vectors and bytes read (floor: the ids, the added
  items and the rotating sample of 32; a FAISS file is read whole by the process, and its update
  then compares every vector with its digest).

**Part B, odd data** (:mod:`_attach_cases`): on every store kind (FAISS Flat and HNSW, LanceDB,
Qdrant, PostgreSQL + pgvector, Milvus Lite FLAT, Chroma) and every attachable method, the
answers claimed exact that differ from exact corrected search, with negative ids, norms off
unit, duplicates out of id order, and 1% of the vectors changed in place (then the full check)
(floor: 0 everywhere).

**Part C, a running server**: ``hubless serve`` with an attached FAISS file; the file rewritten
with one vector changed: the next ``POST /search`` is refused (409) before it answers; after
``hubless attach --update`` the server answers again, exactly.

**Part D, strongly hub-prone** (``--hub-prone``; :mod:`_attach_hubs`): the synthetic set with the
cone (N10 skewness >= 10) on a FAISS Flat file, a FAISS HNSW32 file and Qdrant (payload written),
NNN and IS: the queries certified at k' = 80 before (the single bound) and after the bias bands
(floor: >= 90% on the exact store), one query's p50 against the store's own top-k' at the beam
(floor: <= 3x on FAISS HNSW32 and Qdrant), and on Qdrant what a client querying the store
directly gets (its formula query: recall, certificate, p50), also on the plain set.

Floors apply at the issue's size: ``--n 100000 --dim 256 --queries 10000``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _attach_cases import run_cases  # noqa: E402
from _attach_hubs import run as hub_prone_part  # noqa: E402
from _table import print_table  # noqa: E402

from hubless import NNN  # noqa: E402
from hubless.attached import attach, open_source, update  # noqa: E402
from hubless.engine import exact_search  # noqa: E402

SPEC = "nnn:alpha=0.75,k=16"
FULL = (100_000, 256, 10_000)
#: each store's beam before issue 52 (the default without a recorded one): for the cost row
OLD_BEAM = {"faiss": 2, "qdrant": 4}


def recall_at(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got.tolist(), want.tolist())]))


def make_faiss(path: Path, x, ids, flat: bool = False):
    import faiss

    path = path / "collection.faiss"
    inner = faiss.IndexFlatIP(x.shape[1]) if flat else faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexIDMap2(inner)
    index.add_with_ids(x, ids)
    faiss.write_index(index, str(path))

    def plain(queries):  # the store's own query at its own defaults
        return index.search(queries, 10)[1]

    return str(path), {}, lambda new, new_ids: (index.add_with_ids(new, new_ids), faiss.write_index(index, str(path))), plain


def make_lancedb(path: Path, x, ids):
    import lancedb
    import pyarrow as pa

    def table(rows, keys):
        return pa.table({"id": pa.array(keys, pa.int64()), "vector": pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), x.shape[1])})

    db = lancedb.connect(str(path))
    tbl = db.create_table("docs", table(x, ids))
    tbl.create_index(metric="dot", index_type="IVF_FLAT", num_partitions=max(1, int(np.sqrt(len(x)) / 2)), vector_column_name="vector")

    def plain(queries):
        res = tbl.search(queries[0], vector_column_name="vector").distance_type("dot").limit(10).select(["id", "_distance"]).to_arrow()
        return res["id"].to_numpy()[None, :]

    return f"lancedb://{path}/docs", {}, lambda new, new_ids: tbl.add(table(new, new_ids)), plain


def make_qdrant(path: Path, x, ids):
    import qdrant_edge as qd

    config = qd.EdgeConfig(
        vectors=qd.EdgeVectorParams(size=x.shape[1], distance=qd.Distance.Dot), optimizers=qd.EdgeOptimizersConfig(indexing_threshold=1)
    )
    shard = qd.EdgeShard.create(str(path / "docs"), config)

    def add(rows, keys):
        for lo in range(0, len(rows), 4096):
            points = [qd.Point(int(i), v.tolist(), None) for i, v in zip(keys[lo : lo + 4096], rows[lo : lo + 4096])]
            shard.update(qd.UpdateOperation.upsert_points(points))
        shard.optimize()
        shard.flush()

    add(x, ids)

    def plain(queries):
        requests = [qd.QueryRequest(limit=10, query=qd.Query.Nearest(v), with_payload=False) for v in queries.tolist()]
        return np.array([[p.id for p in hits] for hits in shard.query_batch(qd.QueryBatchRequest(requests))])

    return f"qdrant://{path}/docs", {"shard": shard}, add, plain


MAKERS = {
    "faiss": ("FAISS HNSW32 file", make_faiss),
    "faiss-flat": ("FAISS Flat file", lambda p, x, ids: make_faiss(p, x, ids, flat=True)),
    "lancedb": ("LanceDB IVF_FLAT", make_lancedb),
    "qdrant": ("Qdrant HNSW (in process)", make_qdrant),
}


def p50_single(fn, queries, n: int) -> float:
    times = []
    for i in range(min(n, len(queries))):
        t0 = time.perf_counter()
        fn(queries[i : i + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def synthetic(n: int, dim: int, n_queries: int, bank: int = 5000, seed: int = 0):
    """Hub-prone synthetic items in a shuffled order, the user's ids (sparse, a third negative),
    the query bank, a small gallery bank and the test queries."""
    from hubless.data.synthetic import make_retrieval_data

    data = make_retrieval_data(n_items=n, captions_per_item=max(1, -(-n_queries // n)), dim=dim, n_query_bank=bank,
                               n_gallery_bank=200, n_val_items=10, n_topics=max(25, n // 100), seed=seed)  # fmt: skip
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(data.gallery[rng.permutation(n)], np.float32)
    ids = rng.permutation(n).astype(np.int64) * 3 + 7 - n  # the user's ids: a third of them negative
    q = np.ascontiguousarray(data.queries[rng.choice(len(data.queries), n_queries, replace=False)], np.float32)
    return x, ids, data.query_bank, data.gallery_bank, q


def claims(result, want: np.ndarray) -> str:
    """certified / exact shares, and the claimed ones that differ from ``want``."""
    differ = (result.ids != want).any(axis=1)
    return (
        f"{result.certified.mean():.1%} / {result.exact.mean():.1%}; differ: {int((result.exact & differ).sum())} exact, "
        f"{int((result.certified & differ).sum())} certified"
    )


def store_part(store: str, args, x, ids, bank, q, exact_corrected, exact_plain, folder: Path, full: bool) -> None:
    label, make = MAKERS[store]
    shift = 0 if store != "qdrant" else int(ids.min())  # Qdrant's point ids are unsigned
    ids_here, want, exact_plain = ids - shift, exact_corrected - shift, exact_plain - shift
    uri, options, add, store_plain = make(folder, x, ids_here)
    source = open_source(uri, **options)
    read_t, fit_t, attach_t = [], [], []
    for _ in range(3):  # the store's read, the in-process fit and the attach, interleaved (medians of 3)
        t0 = time.perf_counter()
        for _ in source.scan():
            pass
        read_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        NNN(alpha=0.75, k=16).fit(x, bank)
        fit_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        attached = attach(source, bank, SPEC, out=folder / "sidecar", overwrite=True)
        attach_t.append(time.perf_counter() - t0)
    read_s, fit_s, attach_s = (float(np.median(t)) for t in (read_t, fit_t, attach_t))
    plain = source.search(q, 10).ids if store == "lancedb" else np.concatenate([store_plain(q[i : i + 256]) for i in range(0, len(q), 256)])
    narrow = attached.search_certified(q, 10, max_candidates=80)
    result = attached.search_certified(q, 10)
    beam = attached.beam
    rows = [
        ("recall@10 attached vs exact corrected", f"{recall_at(result.ids, want):.4f}", f">= plain - 0.005 = {recall_at(plain, exact_plain) - 0.005:.4f}"),
        ("recall@10 store plain vs exact plain", f"{recall_at(plain, exact_plain):.4f}", ""),
        ("certified at default k' (80) / after widening", f"{narrow.certified.mean():.1%} / {result.certified.mean():.1%}", ""),
        ("certified / exact; of them, differ from exact corrected", claims(result, want), "0 exact that differ"),
    ]  # fmt: skip
    if store in ("lancedb", "qdrant"):  # the store's own exact search: complete candidates, exact claimed (a scan per query)
        part = min(len(q), 2000)
        shown = claims(attached.search_certified(q[:part], 10, exact=True), want[:part])
        rows.append((f"the same with the store's exact search (exact=True), {part:,} queries", shown, "0 exact that differ"))
    if store.startswith("faiss"):  # one query per call: FAISS's OpenMP threads only add waiting on a loaded machine
        import faiss

        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
    plain_p50 = p50_single(store_plain, q, args.single)
    attached_p50 = p50_single(lambda one: attached.search(one, 10), q, args.single)
    plain_p50 = min(plain_p50, p50_single(store_plain, q, args.single))  # interleaved, twice
    knob = {} if beam is None else {beam["knob"]: int(np.ceil(beam["value"] * 80)) if beam["scaled"] else int(beam["value"])}
    kp_p50 = p50_single(lambda one: source.search(one, 80, **knob), q, args.single)
    if beam is not None:
        shown = f"{beam['knob']} {beam['value']:g}{' x k' + chr(39) if beam['scaled'] else ''}"
        rows.append(
            ("default beam (store recall@80 measured at attach)", f"{shown} ({beam['value_recall']:.3f}; target {beam['target']})", "")
        )
        ladder = ", ".join(f"{value}: {recall:.3f}" for value, recall in beam["recall"])
        rows.append((f"store recall@80 at each {beam['knob']} measured", ladder, ""))
        if store in OLD_BEAM:
            old = {"ef_search": OLD_BEAM[store] * 80}
            old_p50 = p50_single(lambda one: attached.search(one, 10, **old), q, args.single)
            old_result = attached.search_certified(q, 10, **old)
            rows.append(("its cost: 1 query p50 ms at the beam / at the old default", f"{attached_p50:.2f} / {old_p50:.2f} (differ: {claims(old_result, want).split('differ: ')[1]})", ""))  # fmt: skip
    rows += [
        ("1 query p50 ms: attached / plain top-10", f"{attached_p50:.2f} / {plain_p50:.2f} = {attached_p50 / plain_p50:.2f}x", ""),
        ("1 query p50 ms: the store's top-k' (80) at that beam", f"{kp_p50:.2f}", ""),
        ("attach s / (fit + read) s", f"{attach_s:.2f} / ({fit_s:.2f} + {read_s:.2f}) = {attach_s / (fit_s + read_s):.2f}x", "<= 1.5x"),
    ]
    if store.startswith("faiss"):
        faiss.omp_set_num_threads(threads)
    n_new = max(1, args.n // 100)
    from hubless.data.synthetic import make_retrieval_data

    new = make_retrieval_data(n_items=n_new, captions_per_item=1, dim=args.dim, n_query_bank=10, n_gallery_bank=10, n_val_items=10,
                              n_topics=25, seed=1).gallery  # fmt: skip
    add(new, np.arange(n_new, dtype=np.int64) * 3 + int(ids_here.max()) + 10)
    report = update(folder / "sidecar", source, bank)
    if store.startswith("faiss"):
        expected, what = os.path.getsize(uri), "the file's size (read whole)"
    else:
        expected, what = 8 * (args.n + n_new) + (8 + 4 * args.dim) * (n_new + 32), "ids + added + 32 sampled"
    rows += [
        ("update +1%: vectors read / compared with digests", f"{report['read_items']:,} / {report['checked']:,} of {args.n + n_new:,}", ""),
        (f"update +1%: bytes read / {what}", f"{report['bytes_read']:,} / {expected:,}", "<= expected"),
    ]
    print(f"\n### {label}")
    print_table(rows, full_size=full, size=f"{FULL[0]:,} x {FULL[1]}, {FULL[2]:,} queries")
    source.close()


def serve_part(folder: Path) -> None:
    """Part C: a running ``hubless serve`` and a FAISS file rewritten under it."""
    import http.client
    import socket

    import faiss

    x, ids, bank, _, q = synthetic(2000, 64, 5, bank=500, seed=3)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(64))
    index.add_with_ids(x, ids)
    path = folder / "served.faiss"
    faiss.write_index(index, str(path))
    attach(str(path), bank, SPEC, out=folder / "served")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "hubless", "serve", f"mine={folder / 'served'}", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def ask() -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request(
            "POST", "/search", json.dumps({"index": "mine", "embeddings": q.tolist(), "top_k": 10}), {"content-type": "application/json"}
        )
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())

    try:
        for _ in range(600):
            try:
                status, _ = ask()
                break
            except OSError:
                time.sleep(0.1)
        before = ask()
        x[0] = -x[0]
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(64))
        index.add_with_ids(x, ids)
        faiss.write_index(index, str(path))
        changed = ask()
        update(folder / "served", str(path), bank)
        after = ask()
    finally:
        server.terminate()
        server.wait(timeout=30)
    exact = sum(r["exact"] for r in after[1].get("results", []))
    rows = [
        ("answers before the change: status, exact", f"{before[0]}, {sum(r['exact'] for r in before[1]['results'])} of {len(q)}", ""),
        (
            "one vector changed, file rewritten: next answer",
            f"{changed[0]} ({str(changed[1].get('detail', ''))[:70]}...)",
            "refused or re-checked",
        ),
        ("after hubless attach --update: status, exact", f"{after[0]}, {exact} of {len(q)}", ""),
    ]
    print("\n## A running server (hubless serve) and a FAISS file rewritten under it")
    print_table(rows, full_size=True, size="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--bank", type=int, default=5000)
    ap.add_argument("--single", type=int, default=100, help="single queries timed (interleaved)")
    ap.add_argument("--stores", default="faiss,faiss-flat,lancedb,qdrant")
    ap.add_argument("--case-n", type=int, default=5000, help="Part B: items per collection")
    ap.add_argument("--case-dim", type=int, default=64)
    ap.add_argument("--case-queries", type=int, default=300)
    ap.add_argument(
        "--case-stores", default="faiss-flat,faiss-hnsw,lancedb,qdrant,postgresql,milvus,chroma", help="Part B's stores ('' to skip)"
    )
    ap.add_argument("--case-methods", default="all", help="Part B: method specs separated by ; (default: every attachable one)")
    ap.add_argument("--no-serve", action="store_true", help="skip Part C")
    ap.add_argument(
        "--hub-prone", action="store_true", help="Part D: the strongly hub-prone set (bands, the store's ranking; _attach_hubs.py)"
    )
    ap.add_argument("--hub-stores", default="faiss-flat,faiss,qdrant", help="Part D's stores")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.ERROR)
    x, ids, bank, _, q = synthetic(args.n, args.dim, args.queries, args.bank)
    full = (args.n, args.dim, args.queries) == FULL
    order = np.argsort(ids)  # the in-memory fit over the items in id order: ties to the lower id, as exact corrected search
    nnn = NNN(alpha=0.75, k=16).fit(x[order], bank)
    exact_corrected = ids[order][nnn.search(q, 10)[1]]
    exact_plain = ids[order][exact_search(q, x[order], 10)[1]]
    print(
        f"synthetic hub-prone {args.n:,} x {args.dim}, bank {len(bank):,}, {args.queries:,} queries, {SPEC}; one run, {time.strftime('%Y-%m-%d')}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for store in [s for s in args.stores.split(",") if s]:
            folder = Path(tmp) / store
            folder.mkdir()
            store_part(store, args, x, ids, bank, q, exact_corrected, exact_plain, folder, full)
            shutil.rmtree(folder, ignore_errors=True)
        if args.case_stores:
            run_cases(args, lambda n, d, nq: synthetic(n, d, nq, bank=2000, seed=5), full)
        if not args.no_serve:
            serve_part(Path(tmp))
        if args.hub_prone:
            hub_prone_part(args.n, args.dim, args.queries, args.hub_stores.split(","), args.single, Path(tmp))
            hub_prone_part(args.n, args.dim, args.queries, ["qdrant"], args.single, Path(tmp), cone=0.0)


if __name__ == "__main__":
    main()
