"""Serving corrections from FAISS: ratios measured in one run on synthetic unit vectors (d 512).

    python benchmarks/index_speed.py              # gallery 100k, bank 1M (exact bias: ~25 min on 2 cores)
    python benchmarks/index_speed.py --scale 0.3  # gallery 30k, bank 300k (4.3 min on 2 idle cores; no floors)

(a) NNN bias from an IVF index over the bank vs the exact streamed bias: time ratio (the ANN time
    includes training and filling the bank index) and the change in R@1 of the corrected search
    on a task with known answers (floors: >= 10x faster, |delta R@1| <= 0.2 points);
(b) corrected vs uncorrected search latency on the same index type (Flat, IVF, HNSW), i.e. the
    cost of the extra bias dimension, without re-scoring (floor <= 1.05x); medians of repeats;
(c) recall@10 of each ANN index's corrected top-10 (with and without exact re-scoring) against
    the exact corrected top-10;
(d) adding 1% new items to the IVF index (their biases from the bank, inserted into the trained
    lists) vs refitting the correction from scratch (the exact bias time of (a)).

The floors of issue 31 (corrected ANN as accurate as plain ANN) run on their own:

    python benchmarks/index_speed.py --floors                 # COCO MiniLM + synthetic 1M x 512
    python benchmarks/index_speed.py --floors --floor-n 200000  # the synthetic part at 200k
    python benchmarks/index_speed.py --floors --skip-coco --floor-factories ivf  # 1M, IVF only

(e) real MiniLM COCO captions (benchmarks/coco_text.py's cache; gallery = the 20,000 test
    captions 1-4, bank = the 5,000 dev captions, unseen queries = the 5,000 test captions 0):
    recall@10 of corrected IVF256 (NNN) against the exact corrected top 10 vs plain IVF256
    against the exact plain top 10, at the same nprobe (floor: corrected >= plain), with
    and without exact re-scoring, and corrected without the spill / bias-aware probing;
    then the tuner (target 0.95, every candidate) and the recall of its choice on the unseen
    queries (floor: >= 0.95);
(f) synthetic ``--floor-n`` x 512 (bank ``--floor-bank``, NNN k=16, exact bias): for IVF and
    HNSW tuned to recall@10 0.95 on the bank (hubless.index.tuner, one factory each), over
    2,000 test queries: exact corrected search time / corrected ANN search time (batch,
    median of per-repeat ratios, the two interleaved; and one query per call, p50 over
    ``--single-queries``; floor >= 20x), R@1 vs exact (floor |delta| <= 0.1 point) and
    recall@10 on the test queries (floor >= 0.95);
(g) ``--hnsw-diagnosis N``: why HNSW misses the target on the synthetic set: plain vs corrected
    HNSW32 recall at the same ef_search, and the raw rank of the exact corrected top 10.

What one ``Index.search`` call costs on its own (no floor; a search must cost the work of the
search, not a per-call overhead):

    python benchmarks/index_speed.py --call-cost 20000 --call-dim 256

(h) ``--call-cost N``: Flat, IVF (4 sqrt(N) lists, nprobe 16) and HNSW32 over N synthetic unit
    vectors (``--call-dim``), NNN: wall and CPU time per call of 1 and 8 queries (medians of
    ``--repeats`` x 5, interleaved) and per query of a 2,000-query batch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import faiss
import numpy as np
from _table import print_table  # benchmarks/_table.py (run as python benchmarks/...)

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.index.faiss_build import build_faiss, search_parameters


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def r_at_1(index_or_corr, queries, truth) -> float:
    return 100.0 * float(np.mean(index_or_corr.search(queries, 1)[1][:, 0] == truth))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--floors", action="store_true", help="Only the issue-31 floors, (e) and (f).")
    parser.add_argument("--floor-n", type=int, default=1_000_000, help="(f): synthetic gallery size (0: skip (f)).")
    parser.add_argument("--floor-bank", type=int, default=20_000, help="(f): query-bank size.")
    parser.add_argument("--skip-coco", action="store_true", help="(f) only.")
    parser.add_argument("--single-queries", type=int, default=100, help="(f): queries timed one per call.")
    parser.add_argument("--floor-topics", type=int, default=25, help="(f): topics of the synthetic set (fewer: more uneven IVF lists).")
    parser.add_argument(
        "--floor-factories", nargs="+", default=["ivf", "hnsw"], choices=["ivf", "hnsw"],
        help="(f): which index types to tune and time (HNSW32 over 1M x 512 takes about an hour to build on 2 cores).",
    )  # fmt: skip
    parser.add_argument("--hnsw-diagnosis", type=int, default=0, help="(g) only, on a synthetic gallery of this size.")
    parser.add_argument("--call-cost", type=int, default=0, help="(h) only, on a synthetic gallery of this size.")
    parser.add_argument("--call-dim", type=int, default=256, help="(h): dimension.")
    args = parser.parse_args()
    if args.call_cost:
        call_cost(args.call_cost, args.call_dim, args.repeats)
        return
    if args.hnsw_diagnosis:
        hnsw_diagnosis(args.hnsw_diagnosis, args.floor_bank)
        return
    if args.floors:
        floors(args)
        return
    n_gallery, n_bank = int(100_000 * args.scale), int(1_000_000 * args.scale)
    data = make_retrieval_data(n_items=n_gallery, captions_per_item=1, dim=512, n_query_bank=n_bank,
                               n_gallery_bank=10, n_val_items=10, noise=1.3, seed=0)  # fmt: skip
    queries, truth = data.queries[:10_000], data.query_item[:10_000]
    print(f"gallery {n_gallery:,} x bank {n_bank:,} x d 512, NNN k=16 alpha=0.75; {queries.shape[0]:,} test queries\n")

    # (a) exact vs ANN bias
    t0 = time.perf_counter()
    exact = hubless.NNN(k=16).fit(data.gallery, data.query_bank)
    t_exact = time.perf_counter() - t0
    r_exact = r_at_1(exact, queries, truth)
    rows = [
        (
            "(a) R@1 uncorrected -> exact NNN bias",
            f"{r_at_1(hubless.Baseline().fit(data.gallery), queries, truth):.2f} -> {r_exact:.2f}",
            "",
        )
    ]
    for nprobe in (8, 32):
        t0 = time.perf_counter()
        ann = hubless.Index.build(data.gallery, data.query_bank, "nnn", "Flat", bias_search="ann", bias_nprobe=nprobe, keep_banks=False)
        t_ann = time.perf_counter() - t0  # includes the 1,000-item exact error sample, a small share
        r_ann = r_at_1(ann, queries, truth)
        rows += [
            (f"(a) exact bias time / ANN bias time (IVF, nprobe {nprobe})", f"{t_exact / t_ann:.1f}x", ">= 10x"),
            (
                f"(a) R@1 exact bias -> ANN bias (nprobe {nprobe})",
                f"{r_exact:.2f} -> {r_ann:.2f} ({r_ann - r_exact:+.2f})",
                "|delta| <= 0.2",
            ),
            (f"(a) mean |bias_ann - bias_exact| (nprobe {nprobe}, 1,000-item sample)", f"{ann.bias_error['mean_abs']:.5f}", ""),
        ]

    # (b) corrected vs plain latency, (c) recall vs exact corrected top-10
    _, exact_top = exact.search(queries, 10)
    w = np.full((queries.shape[0], 1), -0.75, np.float32)
    corrected_q = np.hstack([queries, w])
    for factory in ("Flat", default_ivf(n_gallery), "HNSW32"):
        plain, _ = build_faiss(factory, data.gallery, data.gallery, spill=0.0)
        corrected, _ = build_faiss(factory, data.gallery, np.hstack([data.gallery, exact.bias_columns_]), spill=0.0)
        params = [search_parameters(index, nprobe=32, ef_search=64) for index in (plain, corrected)]
        t_plain = median_time(lambda plain=plain, p=params[0]: plain.search(queries, 10, params=p), args.repeats)
        t_corr = median_time(lambda corrected=corrected, p=params[1]: corrected.search(corrected_q, 10, params=p), args.repeats)
        rows.append((f"(b) {factory}: corrected / plain search latency", f"{t_corr / t_plain:.3f}x", "<= 1.05x"))
        if factory != "Flat":
            ids = corrected.search(corrected_q, 10, params=params[1])[1]
            idx = hubless.Index(exact, factory, nprobe=32, ef_search=64)
            rescored = idx.search(queries, 10)[1]
            rec = np.mean([len(set(a) & set(b)) for a, b in zip(ids, exact_top)]) / 10
            rec_r = np.mean([len(set(a) & set(b)) for a, b in zip(rescored, exact_top)]) / 10
            rows.append((f"(c) {factory}: recall@10 vs exact corrected (raw / rescored)", f"{rec:.3f} / {rec_r:.3f}", ""))
            if factory.startswith("HNSW"):  # recall is HNSW's knob: show what a larger beam buys
                for ef in (256, 1024):
                    t_ef = median_time(lambda idx=idx, ef=ef: idx.search(queries, 10, ef_search=ef), args.repeats)
                    rec_ef = np.mean([len(set(a) & set(b)) for a, b in zip(idx.search(queries, 10, ef_search=ef)[1], exact_top)]) / 10
                    t_64 = median_time(lambda idx=idx: idx.search(queries, 10), args.repeats)
                    rows.append(
                        (f"(c) {factory}, ef_search {ef}: recall@10 rescored (latency vs ef 64)", f"{rec_ef:.3f} ({t_ef / t_64:.1f}x)", "")
                    )

    # (d) growing an index: incremental add vs a refit from scratch (the exact bias time above)
    index = hubless.Index(exact, default_ivf(n_gallery), query_bank=data.query_bank)
    new_items = data.gallery[: n_gallery // 100] + 0.05 * np.random.default_rng(1).standard_normal(
        (n_gallery // 100, 512), dtype=np.float32
    )
    t0 = time.perf_counter()
    index.add(new_items)
    t_add = time.perf_counter() - t0
    rows.append((f"(d) add {n_gallery // 100:,} items to {index.factory}: refit time / incremental time", f"{t_exact / t_add:.0f}x", ""))
    print_table(rows, full_size=args.scale == 1.0, size="gallery 100k x bank 1M")
    print(f"\n(exact bias {t_exact:.1f}s; faiss {faiss.__version__})")


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |found top-k & exact top-k| / k."""
    return float((found[:, :, None] == exact[:, None, :]).any(axis=2).sum(axis=1).mean() / exact.shape[1])


def floors(args) -> None:
    """Issue 31's floors: (e) on the real COCO MiniLM captions, (f) on a synthetic gallery."""
    from hubless.index.tuner import tune_index

    if not args.skip_coco:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from coco_text import embed

        from hubless.data.karpathy import load_captions

        emb = embed(load_captions("coco", "test5k").captions, "coco-test5k")
        bank = embed(load_captions("coco", "dev").captions, "coco-dev")
        gallery = np.concatenate([emb[i::5] for i in range(1, 5)])
        queries = emb[0::5]
        print(
            f"(e) COCO MiniLM: gallery {gallery.shape[0]:,} x {gallery.shape[1]}, bank {bank.shape[0]:,}, {queries.shape[0]:,} unseen queries"
        )
        rows = []
        plain = hubless.Index.build(gallery, bank, "baseline", "IVF256,Flat", keep_banks=False)
        corrected = hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=16", "IVF256,Flat", keep_banks=False)
        unprotected = hubless.Index(corrected.correction, "IVF256,Flat", spill=0.0)
        unprotected._snap.faiss.quantizer.reset()  # centroids without the half mean bias: the plain probe
        centroids = corrected._snap.faiss.quantizer.reconstruct_n(0, 256)
        centroids[:, unprotected._snap.layout.bias_offset :] = 0
        unprotected._snap.faiss.quantizer.add(centroids)
        exact_plain = plain.correction.search(queries, 10)[1]
        exact_corr = corrected.correction.search(queries, 10)[1]
        for nprobe in (4, 8, 16, 32):
            for rescore in (True, False):
                p = recall_at(plain.search(queries, 10, nprobe=nprobe, rescore=rescore)[1], exact_plain)
                c = recall_at(corrected.search(queries, 10, nprobe=nprobe, rescore=rescore)[1], exact_corr)
                u = recall_at(unprotected.search(queries, 10, nprobe=nprobe, rescore=rescore)[1], exact_corr)
                label = (
                    f"(e) IVF256 nprobe {nprobe}{'' if rescore else ', no re-scoring'}: recall@10 plain / corrected (no spill, plain probe)"
                )
                rows.append((label, f"{p:.3f} / {c:.3f} ({u:.3f}); {c - p:+.3f}", "corrected >= plain"))
        tuned = tune_index(corrected.correction, bank, target_recall=0.95, keep_banks=False)
        t = tuned.config.tuning
        unseen = recall_at(tuned.search(queries, 10)[1], exact_corr)
        tried = "; ".join(
            f"{c['factory']} {c.get('param') or ''}={c.get('value')} {c.get('recall')} {c.get('p50_ms')}ms" for c in t["candidates"]
        )
        rows.append(("(e) tuner, target 0.95: candidates (knob, bank recall, p50)", tried, ""))
        rows.append(
            (
                f"(e) tuner's choice {t['factory']} {t['param'] or ''}={t['value']}: recall bank / held-out bank / unseen test",
                f"{t['recall']:.3f} / {t['heldout_recall']:.3f} / {unseen:.3f}",
                ">= 0.95 unseen",
            )
        )
        print_table(rows, full_size=True, size="COCO 20k")

    n, n_bank = args.floor_n, args.floor_bank
    if n <= 0:
        return
    t0 = time.perf_counter()
    data = make_retrieval_data(n_items=n, captions_per_item=1, dim=512, n_query_bank=n_bank, n_gallery_bank=10,
                               n_val_items=10, noise=1.3, n_topics=args.floor_topics, seed=0)  # fmt: skip
    queries, truth = data.queries[:2000], data.query_item[:2000]
    corr = hubless.NNN(k=16).fit(data.gallery, data.query_bank)
    del data.queries
    print(
        f"\n(f) synthetic gallery {n:,} x 512 ({args.floor_topics:,} topics), bank {n_bank:,}, NNN k=16 (data + exact fit {time.perf_counter() - t0:.0f}s); 2,000 test queries"
    )
    flat = hubless.Index(corr, "Flat")
    exact_ids = flat.search(queries, 10)[1]
    r1_exact = 100.0 * float(np.mean(exact_ids[:, 0] == truth))
    rows = []
    for factory in [{"ivf": default_ivf(n), "hnsw": "HNSW32"}[f] for f in args.floor_factories]:
        t0 = time.perf_counter()
        index = tune_index(corr, data.query_bank, target_recall=0.95, factories=[factory], keep_banks=False)
        t = index.config.tuning
        faiss.cvar.indexIVF_stats.reset()
        ids = index.search(queries, 10)[1]
        scanned = faiss.cvar.indexIVF_stats.ndis / len(queries)  # 0 for HNSW
        ratios = []
        for _ in range(args.repeats):
            t_exact = median_time(lambda: flat.search(queries, 10), 1)
            t_ann = median_time(lambda index=index: index.search(queries, 10), 1)
            ratios.append(t_exact / t_ann)
        single = []  # one query per call, as a service answers them: exact and ANN interleaved
        for i in range(args.single_queries):
            one = queries[i : i + 1]
            t_exact = median_time(lambda one=one: flat.search(one, 10), 1)
            t_ann = median_time(lambda one=one, index=index: index.search(one, 10), 1)
            single.append((t_exact, t_ann))
        exact_ms, ann_ms = (1000 * statistics.median(x) for x in zip(*single)) if single else (float("nan"), float("nan"))
        r1 = 100.0 * float(np.mean(ids[:, 0] == truth))
        knob = f"{t['param']}={t['value']}"
        rows += [
            (f"(f) {factory} {knob} (tuned 0.95 on the bank in {time.perf_counter() - t0:.0f}s): recall@10 bank / test", f"{t['recall']:.3f} / {recall_at(ids, exact_ids):.3f}", ">= 0.95"),
            (f"(f) {factory} {knob}: exact corrected time / corrected ANN time, 2,000-query batch (median of {args.repeats})", f"{statistics.median(ratios):.1f}x (runs {', '.join(f'{r:.1f}' for r in ratios)})", ">= 20x"),
            *([(f"(f) {factory} {knob}: the same, one query per call (p50 of {len(single)} queries)", f"{exact_ms / ann_ms:.1f}x ({exact_ms:.1f} ms / {ann_ms:.2f} ms)", ">= 20x")] if single else []),
            *([(f"(f) {factory} {knob}: items scanned per query (FAISS ndis, spilled copies included)", f"{scanned:,.0f} = {scanned / n:.2%} of the gallery ({args.floor_topics:,} topics)", "")] if scanned else []),
            (f"(f) {factory} {knob}: R@1 exact -> ANN", f"{r1_exact:.2f} -> {r1:.2f} ({r1 - r1_exact:+.2f})", "|delta| <= 0.1"),
        ]  # fmt: skip
        del index
    print_table(rows, full_size=n >= 1_000_000, size="gallery 1M x 512")
    print(f"(faiss {faiss.__version__})")


def hnsw_diagnosis(n: int, n_bank: int) -> None:
    """(g) Why HNSW misses a recall target on the synthetic set: plain HNSW32 against the exact
    plain top 10 and corrected HNSW32 against the exact corrected top 10, at the same ef_search,
    and how deep in the raw ranking the corrected top 10 sits."""
    data = make_retrieval_data(n_items=n, captions_per_item=1, dim=512, n_query_bank=n_bank, n_gallery_bank=10,
                               n_val_items=10, noise=1.3, seed=0)  # fmt: skip
    queries = data.queries[:1000]
    corr = hubless.NNN(k=16).fit(data.gallery, data.query_bank)
    plain = hubless.Baseline().fit(data.gallery)
    rows = []
    exact_c, exact_p = corr.search(queries, 10)[1], plain.search(queries, 10)[1]
    raw_rank = np.argsort(np.argsort(-(queries @ corr.gallery_.T), axis=1), axis=1)
    depth = np.take_along_axis(raw_rank, exact_c, axis=1)
    rows.append(
        (
            "(g) raw rank of the exact corrected top 10: median / 90th pct / 99th pct",
            f"{np.median(depth):.0f} / {np.percentile(depth, 90):.0f} / {np.percentile(depth, 99):.0f}",
            "",
        )
    )
    for name, fitted, exact in (("plain", plain, exact_p), ("corrected", corr, exact_c)):
        index = hubless.Index(fitted, "HNSW32")
        curve = [f"{recall_at(index.search(queries, 10, ef_search=ef)[1], exact):.3f}" for ef in (64, 256, 1024, 4096)]
        rows.append((f"(g) HNSW32 {name}: recall@10 at ef_search 64 / 256 / 1024 / 4096", " / ".join(curve), ""))
    ivf = hubless.Index(corr, default_ivf(n))
    rows.append(
        (
            f"(g) {default_ivf(n)} corrected: recall@10 at nprobe 16 / 64",
            " / ".join(f"{recall_at(ivf.search(queries, 10, nprobe=p)[1], exact_c):.3f}" for p in (16, 64)),
            "",
        )
    )
    print(f"(g) synthetic {n:,} x 512, bank {n_bank:,}, NNN k=16, 1,000 test queries")
    print_table(rows, full_size=True, size="")


def call_cost(n: int, dim: int, repeats: int) -> None:
    """(h) Wall and CPU time of one ``Index.search`` call of 1 and 8 queries, and per query of a
    2,000-query batch, for Flat, IVF and HNSW32 over ``n`` synthetic unit vectors."""

    def unit(rows: int, seed: int) -> np.ndarray:
        x = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    gallery, bank, queries = unit(n, 0), unit(5_000, 1), unit(2_000, 2)
    corr = hubless.NNN(alpha=0.75, k=16).fit(gallery, bank)
    print(f"(h) gallery {n:,} x d {dim}, bank 5,000, NNN k=16 alpha=0.75")
    rows = []
    for factory in ("Flat", default_ivf(n), "HNSW32"):
        index = hubless.Index(corr, factory, nprobe=16, ef_search=64)
        index.search(queries[:8], 10)
        times: dict[int, list[tuple[float, float]]] = {1: [], 8: []}
        for rep in range(5 * repeats):
            for nq in (1, 8):
                q = queries[(rep * 8) % 1_992 :][:nq]
                c0, t0 = time.process_time(), time.perf_counter()
                index.search(q, 10)
                times[nq].append((time.perf_counter() - t0, time.process_time() - c0))
        batch = []
        for _ in range(max(1, repeats // 2)):
            c0, t0 = time.process_time(), time.perf_counter()
            index.search(queries, 10)
            batch.append((time.perf_counter() - t0, time.process_time() - c0))
        for label, values, per in (
            ("1 query, per call", times[1], 1),
            ("8 queries, per call", times[8], 1),
            ("2,000 queries, per query", batch, 2_000),
        ):
            wall = statistics.median(v[0] for v in values) / per * 1e3
            cpu = statistics.median(v[1] for v in values) / per * 1e3
            rows.append((f"(h) {factory}: {label}: wall / CPU ms", f"{wall:.3f} / {cpu:.3f}", ""))
    print_table(rows, full_size=True, size="")


def default_ivf(n: int) -> str:
    return f"IVF{int(2 ** round(np.log2(4 * np.sqrt(n))))},Flat"


if __name__ == "__main__":
    main()
