"""The strongly hub-prone part of ``benchmarks/attach.py`` (issue 52 items 5 and 6).

    .venv/bin/python benchmarks/attach.py --hub-prone [--n 10000 --dim 128 --queries 1000]
    .venv/bin/python benchmarks/_attach_hubs.py [--n ...]          (this part alone)

Data: hubless's synthetic set with the cone (``make_retrieval_data(cone=0.5)``: captions lean
towards one axis, a few images almost as much: global hubs), its N10 skewness measured on the
queries (>= 10; the plain synthetic set has 2.4-3.3). Stores, each written as a user would (the
user's ids, never through hubless): a FAISS ``IndexIDMap2(IndexFlatIP)`` file (an exact store), a
FAISS ``IndexIDMap2(IndexHNSWFlat(d, 32))`` file and a shard of Qdrant's in-process engine with
its HNSW index (Dot), attached with ``write_payload=True`` (the bias as a payload field, with a
float index on it: what the band filter reads), then optimized (``shard.optimize()``: the
in-process engine answers rewritten points by a scan until then). Methods: NNN (alpha 0.75, k 16) and IS. Per
store and method, before (the single bound: ``attached.bands = None``) and after (the bands):

* the queries certified at the default k' (80, no widening), and exact; the answers claimed
  exact that differ from exact corrected search (floor: 0) and the certified ones that do
  (through an ANN index certified is relative to the store's plain and filtered ranking);
* recall@10 of the attached search (widening allowed) against exact corrected search;
* p50 of one attached query (widening allowed), wall clock and CPU time of the process (what
  the query costs; the wall clock adds the waits of a shared machine), against the store's own
  top-k' query at the default k' and the attached search's beam, through its own client
  (floor, after: <= 3x on FAISS HNSW32 and Qdrant), and against its plain top-10 at its own
  defaults (reported); one query per call, FAISS on one thread, interleaved, medians;
* on Qdrant (item 6), what a client querying the store directly gets: the store's corrected
  top-10 among its plain top-k' (a prefetch and a formula query, one request), its recall@10
  against exact corrected search and what the certificate says of it, next to the plain top-10's
  recall; the formula query's p50 against the plain top-10's. Qdrant also runs on the plain
  hub-prone set (no cone).

Floors apply at ``--n 100000 --dim 256 --queries 10000`` (at least 90% certified at k' = 80 on
the exact store).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _table import print_table  # noqa: E402

from hubless.attached import attach  # noqa: E402
from hubless.attached.beam import beam_knobs  # noqa: E402

METHODS = {"NNN": "nnn:alpha=0.75,k=16", "IS": "is"}
FULL = (100_000, 256, 10_000)
CONE = 0.5
KP = 80


def hub_prone_set(n: int, dim: int, n_queries: int, bank: int = 5000, seed: int = 0, cone: float = CONE):
    """The strongly hub-prone items (shuffled; ``cone=0``: the plain hub-prone set), the user's
    ids, the query bank, the test queries and their N10 skewness (plain exact top-10)."""
    from hubless.data.synthetic import make_retrieval_data
    from hubless.engine import exact_search
    from hubless.metrics import hubness_statistics

    data = make_retrieval_data(
        n_items=n,
        captions_per_item=max(1, -(-n_queries // n)),
        dim=dim,
        n_query_bank=bank,
        n_gallery_bank=10,
        n_val_items=10,
        n_topics=max(25, n // 100),
        seed=seed,
        cone=cone,
    )
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(data.gallery[rng.permutation(n)], np.float32)
    ids = rng.permutation(n).astype(np.int64) * 3 + 7
    q = np.ascontiguousarray(data.queries[rng.choice(len(data.queries), n_queries, replace=False)], np.float32)
    skew = hubness_statistics(exact_search(q, x, 10)[1], n, ks=(10,))["N10_skewness"]
    return x, ids, data.query_bank, q, float(skew)


def faiss_store(folder: Path, x, ids, hnsw: bool):
    import faiss

    inner = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT) if hnsw else faiss.IndexFlatIP(x.shape[1])
    index = faiss.IndexIDMap2(inner)
    index.add_with_ids(x, ids)
    faiss.write_index(index, str(folder / "c.faiss"))

    def own(queries, k, knobs):  # the store's own query, through FAISS's client
        if hnsw and knobs.get("ef_search"):
            return index.search(queries, k, params=faiss.SearchParametersHNSW(efSearch=int(knobs["ef_search"])))
        return index.search(queries, k)

    return str(folder / "c.faiss"), {}, own


def qdrant_store(folder: Path, x, ids):
    import qdrant_edge as qd

    config = qd.EdgeConfig(
        vectors=qd.EdgeVectorParams(size=x.shape[1], distance=qd.Distance.Dot), optimizers=qd.EdgeOptimizersConfig(indexing_threshold=1)
    )
    shard = qd.EdgeShard.create(str(folder / "docs"), config)
    for lo in range(0, len(x), 4096):
        shard.update(
            qd.UpdateOperation.upsert_points([qd.Point(int(i), v.tolist(), None) for i, v in zip(ids[lo : lo + 4096], x[lo : lo + 4096])])
        )
    shard.optimize()
    shard.flush()

    def own(queries, k, knobs, formula=None, prefetch=None):  # the store's own query; with a formula: ranked by it
        params = qd.SearchParams(hnsw_ef=int(knobs["ef_search"])) if knobs.get("ef_search") else None
        if formula is None:
            requests = [qd.QueryRequest(limit=k, query=qd.Query.Nearest(v), params=params, with_payload=False) for v in queries.tolist()]
        else:
            terms = [
                qd.Expression.Mult([qd.Expression.Constant(-w), qd.Expression.Variable(f)]) for w, f in zip(formula.weights, formula.fields)
            ]
            score = qd.Formula(qd.Expression.Sum([qd.Expression.Variable("$score"), *terms]))
            requests = [
                qd.QueryRequest(
                    limit=k,
                    prefetches=[qd.Prefetch(limit=prefetch, query=qd.Query.Nearest(v), params=params)],
                    query=score,
                    with_payload=False,
                )
                for v in queries.tolist()
            ]
        return shard.query_batch(qd.QueryBatchRequest(requests))

    return f"qdrant://{folder}/docs", {"shard": shard}, own


STORES = {
    "faiss-flat": ("FAISS Flat file (exact)", lambda f, x, ids: faiss_store(f, x, ids, hnsw=False)),
    "faiss": ("FAISS HNSW32 file", lambda f, x, ids: faiss_store(f, x, ids, hnsw=True)),
    "qdrant": ("Qdrant HNSW (in process), payload written", qdrant_store),
}


def p50(fn, queries, n: int) -> np.ndarray:
    """Median ms of one query per call: (wall clock, CPU time of the process). The CPU time is
    what the query costs; the wall clock adds the waits of a shared machine."""
    times = []
    for i in range(min(n, len(queries))):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(queries[i : i + 1])
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return np.median(np.asarray(times), axis=0) * 1000


def claims(result, want) -> tuple[float, float, int, int]:
    """certified and exact shares; the claimed exact and certified answers that differ from ``want``."""
    differ = (result.ids != want).any(axis=1)
    return (
        float(result.certified.mean()),
        float(result.exact.mean()),
        int((result.exact & differ).sum()),
        int((result.certified & differ).sum()),
    )


def recall(got, want) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got.tolist(), want.tolist())]))


def store_ranking_rows(attached, q, want, own, single: int) -> list[tuple[str, str, str]]:
    """Item 6: what a client querying the store directly gets (the store's corrected top-10 among
    its plain top-k', one request; :func:`hubless.attached.store_ranking.ranked_in_store`), its
    recall against exact corrected search, what the certificate says of it, and its p50 through
    the store's own client next to the plain top-10 at the same beam."""
    from hubless.attached.store_ranking import ranked_in_store, store_formula

    formula = store_formula(attached)
    rows = []
    for kp in (KP, 4 * KP):
        got = ranked_in_store(attached, q, 10, candidates=kp)
        rows.append(
            (
                f"store-ranked top-10 of its top {kp}: recall@10 / certified / exact",
                f"{recall(got.ids, want):.4f} / {got.certified.mean():.1%} / {got.exact.mean():.1%}",
                "",
            )
        )
    plain = own(q, 10, beam_knobs(attached.beam, {}, KP))
    plain_ids = np.array([[p.id for p in hits] for hits in plain])
    rows.append(("the store's plain top-10 (no correction): recall@10 vs exact corrected", f"{recall(plain_ids, want):.4f}", ""))
    knobs = beam_knobs(attached.beam, {}, KP)
    t_formula, t_plain = [], []
    for _ in range(2):
        t_formula.append(p50(lambda one: own(one, 10, knobs, formula=formula, prefetch=KP), q, single))
        t_plain.append(p50(lambda one: own(one, 10, knobs), q, single))
    tf, tp = np.median(t_formula, axis=0), np.median(t_plain, axis=0)
    rows.append(("1 query p50 ms, wall / CPU: formula query (prefetch 80)", f"{tf[0]:.2f} / {tf[1]:.2f}", ""))
    rows.append(("1 query p50 ms, wall / CPU: plain top-10, same beam", f"{tp[0]:.2f} / {tp[1]:.2f} ({tf[1] / tp[1]:.2f}x CPU)", ""))
    return rows


def run(n: int, dim: int, n_queries: int, stores: list[str], single: int, folder: Path, cone: float = CONE) -> None:
    """Print the part's table, one block per store and method."""
    import faiss

    x, ids, bank, q, skew = hub_prone_set(n, dim, n_queries, cone=cone)
    full = (n, dim, n_queries) == FULL
    kind = f"Strongly hub-prone (synthetic, cone {cone})" if cone else "Hub-prone (synthetic, no cone)"
    print(f"\n## {kind}: {n:,} x {dim}, {n_queries:,} queries, N10 skewness {skew:.1f}")
    for store in stores:
        label, make = STORES[store]
        where = folder / f"hubs-{store}-{cone}"
        where.mkdir()
        uri, options, own = make(where, x, ids)
        for name, spec in METHODS.items():
            attached = attach(
                uri,
                bank,
                spec,
                out=where / f"side-{name}",
                write_payload=store == "qdrant" and f"hubless_{name.lower()}",
                progress=False,
                **options,
            )
            if store == "qdrant":  # as docs/attach.md advises: the payload write left the rewritten points to a scan
                started = time.perf_counter()
                options["shard"].optimize()
                print(f"(Qdrant shard optimized after the payload write of {name}: {time.perf_counter() - started:.0f} s)")
            want = attached.exact_search(q, 10).ids
            bands = attached.bands
            attached.bands = None
            before = (attached.search_certified(q, 10, max_candidates=KP), attached.search_certified(q, 10))
            attached.bands = bands
            after = (attached.search_certified(q, 10, max_candidates=KP), attached.search_certified(q, 10))
            knobs = beam_knobs(attached.beam, {}, KP)
            threads = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(1)  # one query per call: FAISS's OpenMP threads only add waiting on a loaded machine
            times: dict[str, list[np.ndarray]] = {"before": [], "after": [], "topk": [], "top-10": []}
            for _ in range(2):  # interleaved, twice: the machine is shared, only adjacent timings compare
                times["topk"].append(p50(lambda one, o=own, kn=knobs: o(one, KP, kn), q, single))
                times["after"].append(p50(lambda one, a=attached: a.search(one, 10), q, single))
                times["top-10"].append(p50(lambda one, o=own: o(one, 10, {}), q, single))
                attached.bands = None
                times["before"].append(p50(lambda one, a=attached: a.search(one, 10), q, single))
                attached.bands = bands
            faiss.omp_set_num_threads(threads)
            t = {key: np.median(v, axis=0) for key, v in times.items()}  # (wall, CPU)
            shown = f"{knobs['ef_search']} (= {knobs['ef_search'] // KP} x k')" if "ef_search" in knobs else "exact"
            rows = []
            for when, (narrow, wide) in (("before (single bound)", before), ("after (bands)", after)):
                cert, exact, wrong_exact, wrong_cert = claims(narrow, want)
                rows += [
                    (
                        f"{when}: certified / exact at k' = {KP}",
                        f"{cert:.1%} / {exact:.1%}",
                        ">= 90% (exact store, after)" if "after" in when else "",
                    ),
                    (f"{when}: claimed exact / certified that differ", f"{wrong_exact} / {wrong_cert}", "0 exact"),
                    (
                        f"{when}: widened: certified, k' p50 / max, recall@10",
                        f"{wide.certified.mean():.1%}, {np.median(wide.candidates):.0f} / "
                        f"{wide.candidates.max()}, {recall(wide.ids, want):.4f}",
                        "",
                    ),
                ]
            rows += [
                ("beam (ef_search at k' = 80)", shown, ""),
                ("1 query p50 ms, wall / CPU: attached before", f"{t['before'][0]:.2f} / {t['before'][1]:.2f}", ""),
                ("1 query p50 ms, wall / CPU: attached after", f"{t['after'][0]:.2f} / {t['after'][1]:.2f}", ""),
                ("1 query p50 ms, wall / CPU: store's top-k' at the beam", f"{t['topk'][0]:.2f} / {t['topk'][1]:.2f}", ""),
                ("1 query p50 ms, wall / CPU: store's plain top-10", f"{t['top-10'][0]:.3f} / {t['top-10'][1]:.3f}", ""),
                (
                    "p50 ratio vs the store's top-k', wall / CPU: before",
                    f"{t['before'][0] / t['topk'][0]:.1f}x / {t['before'][1] / t['topk'][1]:.1f}x",
                    "",
                ),
                (
                    "p50 ratio vs the store's top-k', wall / CPU: after",
                    f"{t['after'][0] / t['topk'][0]:.1f}x / {t['after'][1] / t['topk'][1]:.1f}x",
                    "<= 3x (FAISS HNSW32, Qdrant)",
                ),
                (
                    "p50 ratio vs the store's plain top-10, wall / CPU: before / after",
                    f"{t['before'][0] / t['top-10'][0]:.0f}x / {t['after'][0] / t['top-10'][0]:.0f}x, "
                    f"{t['before'][1] / t['top-10'][1]:.0f}x / {t['after'][1] / t['top-10'][1]:.0f}x",
                    "",
                ),
            ]
            if store == "qdrant":
                rows += store_ranking_rows(attached, q, want, own, single)
            print(f"\n### {label}, {name} ({spec})")
            print_table(rows, full_size=full, size=f"{FULL[0]:,} x {FULL[1]}, {FULL[2]:,} queries")
            attached.source.close()


def main() -> None:
    import logging
    import warnings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single", type=int, default=100, help="single queries timed (interleaved)")
    ap.add_argument("--stores", default="faiss-flat,faiss,qdrant")
    ap.add_argument("--plain-stores", default="qdrant", help="stores also run on the plain hub-prone set (no cone; '' to skip)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        run(args.n, args.dim, args.queries, args.stores.split(","), args.single, Path(tmp))
        if args.plain_stores:
            run(args.n, args.dim, args.queries, args.plain_stores.split(","), args.single, Path(tmp), cone=0.0)


if __name__ == "__main__":
    main()
