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
    args = parser.parse_args()
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


def default_ivf(n: int) -> str:
    return f"IVF{int(2 ** round(np.log2(4 * np.sqrt(n))))},Flat"


if __name__ == "__main__":
    main()
