"""Deterministic ties in the distributed fit (issue 33): with duplicated gallery rows, tiles of
any size and cuts of any shape, merged in any order, give the single-machine fit's top-k ids.

Why it could fail: a BLAS rounds a product differently in the last bit depending on the shape
of the call (a one-row product takes another code path), so a duplicated row cut off on its own
would no longer tie with its copy; and log-sum-exps folded in arrival order round differently
per run. The tiles compute on the single pass's block grid and the merger folds in bank order.
Log-sum-exps (IS, DIS, DualIS, DualDIS) need more: the BLAS also rounds identical rows at
different row positions of one product differently (538 of 16,384 similarities of two copies in
one 512 x 16,384 block), so copies' sums agree only where the pass sums the very same terms in
the very same order. A tile sums whole column blocks around the pass's shift and hands back each
block's sums, which the merger adds in bank order as the pass does: bitwise.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubless.corrections import make_correction
from hubless.distributed.plan import plan_tiles, tile_span
from hubless.distributed.tile_compute import compute_tile, compute_tile_streamed
from hubless.distributed.tile_merge import TileMerger
from hubless.engine.statistics import StatisticsRequest, compute_statistics
from hubless.engine.stream import COL_BLOCK, ROW_BLOCK
from tests.conftest import unit_rows

SPECS = ["nnn:k=5", "csls:k=4", "is:beta=20.0", "is:beta=0.5", "dis:k_activation=3", "dualis", "dualdis:k_activation=2"]


def _with_duplicates(rng, n: int, d: int, n_unique: int) -> np.ndarray:
    """``n`` rows drawn from ``n_unique`` distinct unit rows: many exact copies, far apart."""
    return unit_rows(rng, n_unique, d)[rng.integers(0, n_unique, n)]


def _tiled_fit(spec, gallery, query_bank, gallery_bank, gallery_rows, bank_cols, order_seed, bank_read=None):
    corr = make_correction(spec)
    request = corr.statistics_request()
    n_gb = None if corr.gallery_bank_use == "ignored" else len(gallery_bank)
    tiles = plan_tiles(request, len(gallery), len(query_bank), n_gb, gallery_rows=gallery_rows, bank_cols=bank_cols)
    random.Random(order_seed).shuffle(tiles)
    merger = TileMerger(tiles, request, len(gallery), gallery.shape[1])
    for t in tiles:
        bank = query_bank if t.side == "query" else gallery_bank
        if bank_read:  # as a Ray task computes it: the bank a piece at a time
            part = compute_tile_streamed(t, lambda a, b: gallery[a:b], lambda a, b, x=bank: x[a:b],
                                         request, len(gallery), len(bank), bank_read=bank_read)  # fmt: skip
        else:
            (g0, g1), (b0, b1) = tile_span(t, len(gallery), len(bank))  # what the task reads
            part = compute_tile(t, gallery[g0:g1], bank[b0:b1], request, gallery_from=g0, bank_from=b0, first_block=bank[:COL_BLOCK])
        merger.add(t, part)
    return corr.fit(gallery, statistics=merger.result())


def _assert_identical_ranking(got, want, queries):
    """Statistics bitwise, so the top 10 ids and scores are bitwise too (duplicated gallery rows
    tie in both and go to the lower id)."""
    gs, ws = got.statistics_, want.statistics_
    if ws.query_topk is not None:
        np.testing.assert_array_equal(gs.query_topk, ws.query_topk)
    for name in ("query_activation", "gallery_activation"):
        if getattr(ws, name) is not None:
            np.testing.assert_array_equal(getattr(gs, name), getattr(ws, name))
            np.testing.assert_array_equal(getattr(gs, f"{name}_scores"), getattr(ws, f"{name}_scores"))
    for name in ("query_lse", "gallery_lse"):
        assert getattr(gs, name).keys() == getattr(ws, name).keys()
        for beta, values in getattr(ws, name).items():
            np.testing.assert_array_equal(getattr(gs, name)[beta], values, err_msg=f"{name} at beta={beta}")
    got_scores, got_ids = got.search(queries, 10)
    want_scores, want_ids = want.search(queries, 10)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_scores, want_scores)


# Two shapes, each past one column block on one side, so cuts fall inside the engine's row and
# column blocks of both passes (the gallery is the column side of the activation pass).
SHAPES = {"wide bank": (3 * ROW_BLOCK + 77, COL_BLOCK + 700), "wide gallery": (COL_BLOCK + 700, 3 * ROW_BLOCK + 77)}
DIM = 16
_DATA: dict = {}


def _data(shape: str, spec: str):
    if shape not in _DATA:
        rng = np.random.default_rng(33)
        n_gallery, n_bank = SHAPES[shape]
        _DATA[shape] = {
            "gallery": _with_duplicates(rng, n_gallery, DIM, 40),
            "query_bank": _with_duplicates(rng, n_bank, DIM, n_bank // 2),
            "gallery_bank": unit_rows(rng, 2 * ROW_BLOCK + 5, DIM),
            "queries": unit_rows(rng, 300, DIM),
        }
    d = _DATA[shape]
    if spec not in d:
        d[spec] = make_correction(spec).fit(d["gallery"], d["query_bank"], d["gallery_bank"])
    return d


def _cuts():
    """A tile size or explicit cut points, often one row off a block boundary."""
    near = st.sampled_from([1, ROW_BLOCK - 1, ROW_BLOCK + 1, COL_BLOCK - 1, COL_BLOCK, COL_BLOCK + 1])
    return st.one_of(st.integers(700, COL_BLOCK + 700), st.lists(st.one_of(st.integers(1, COL_BLOCK + 700), near), min_size=1, max_size=3))


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    spec=st.sampled_from(SPECS),
    g_cuts=_cuts(),
    b_cuts=_cuts(),
    order=st.integers(0, 10_000),
    bank_read=st.sampled_from([None, COL_BLOCK]),
)
def test_any_tiles_and_cuts_with_duplicated_rows_give_the_single_machine_top_k(shape, spec, g_cuts, b_cuts, order, bank_read):
    d = _data(shape, spec)
    got = _tiled_fit(spec, d["gallery"], d["query_bank"], d["gallery_bank"], g_cuts, b_cuts, order, bank_read)
    _assert_identical_ranking(got, d[spec], d["queries"])


@settings(max_examples=30, deadline=None)
@given(
    spec=st.sampled_from(SPECS),
    g_cuts=st.lists(st.integers(1, 119), max_size=6),
    b_cuts=st.lists(st.integers(1, 299), max_size=6),
    seed=st.integers(0, 10_000),
)
def test_small_tiles_with_duplicated_rows_give_the_single_machine_top_k(spec, g_cuts, b_cuts, seed):
    rng = np.random.default_rng(seed)
    gallery, query_bank = _with_duplicates(rng, 120, 8, 25), _with_duplicates(rng, 300, 8, 150)
    gallery_bank, queries = unit_rows(rng, 90, 8), unit_rows(rng, 40, 8)
    want = make_correction(spec).fit(gallery, query_bank, gallery_bank)
    got = _tiled_fit(spec, gallery, query_bank, gallery_bank, g_cuts, b_cuts, seed)
    _assert_identical_ranking(got, want, queries)


def test_the_merge_is_bitwise_the_same_in_every_arrival_order():
    """Log-sum-exps are folded in bank order whatever order the tiles finish in."""
    rng = np.random.default_rng(4)
    gallery, bank = _with_duplicates(rng, 200, 8, 30), unit_rows(rng, 700, 8)
    request = make_correction("dis:k_activation=3").statistics_request().merge(make_correction("nnn:k=5").statistics_request())
    tiles = plan_tiles(request, 200, 700, None, gallery_rows=[90], bank_cols=[100, 350, 600])
    parts = {t: compute_tile(t, gallery, bank, request) for t in tiles}
    results = []
    for order in itertools.islice(itertools.permutations(tiles), 0, None, 977):  # 8 tiles: 40320 orders, every 977th
        merger = TileMerger(tiles, request, 200, 8)
        for t in order:
            merger.add(t, parts[t])
        results.append(merger.result().to_arrays())
    assert len(results) > 40
    for other in results[1:]:
        assert other.keys() == results[0].keys()
        for name, values in results[0].items():
            np.testing.assert_array_equal(other[name], values, err_msg=name)


def test_ray_with_duplicated_rows_and_uneven_cuts_gives_the_single_machine_top_k(ray_local, tmp_path):
    import hubless.distributed as hd

    rng = np.random.default_rng(8)
    gallery, bank = _with_duplicates(rng, 1500, 16, 300), _with_duplicates(rng, 2600, 16, 2000)
    queries = unit_rows(rng, 200, 16)
    for name, x, cuts in (("g", gallery, [1, 700, 701]), ("b", bank, [999])):
        (tmp_path / name).mkdir()
        for i, (a, b) in enumerate(itertools.pairwise([0, *cuts, len(x)])):
            np.save(tmp_path / name / f"part_{i}.npy", x[a:b])
    for spec in ("is:beta=20.0", "dis:k_activation=3"):
        want = make_correction(spec).fit(gallery, bank)
        got = hd.fit(spec, tmp_path / "g", tmp_path / "b", gallery_rows=[3, 511, 1000], bank_cols=[1, 1300], progress=False)
        _assert_identical_ranking(got, want, queries)


def test_a_wide_tile_read_a_piece_at_a_time_equals_narrow_tiles_merged():
    """A Ray task folds the pieces of a wide tile in bank order, as the merger folds narrow
    tiles: the statistics are bitwise the same, and the task never holds more than one piece."""
    rng = np.random.default_rng(6)
    gallery, bank = _with_duplicates(rng, 700, 4, 90), unit_rows(rng, 2 * COL_BLOCK + 300, 4)
    request = make_correction("dis:k_activation=2").statistics_request().merge(make_correction("nnn:k=3").statistics_request())
    read = []

    def read_bank(a, b):
        read.append(b - a)
        return bank[a:b]

    wide = plan_tiles(request, 700, len(bank), None, gallery_rows=[250], bank_cols=len(bank))
    merger = TileMerger(wide, request, 700, 4)
    for t in wide:
        merger.add(t, compute_tile_streamed(t, lambda a, b: gallery[a:b], read_bank, request, 700, len(bank), bank_read=COL_BLOCK))
    assert max(read) == COL_BLOCK and len(read) == 3 * len(wide)
    narrow = plan_tiles(request, 700, len(bank), None, gallery_rows=[250], bank_cols=COL_BLOCK)
    reference = TileMerger(narrow, request, 700, 4)
    for t in narrow:
        reference.add(t, compute_tile(t, gallery, bank, request))
    want = reference.result().to_arrays()
    for name, values in merger.result().to_arrays().items():
        np.testing.assert_array_equal(values, want[name], err_msg=name)


def test_a_merger_with_a_sink_keeps_no_per_item_numbers_and_hands_over_the_same_rows():
    """write_augmented's driver: each finished gallery shard's rows go to the sink (a file per
    shard), in any arrival order, bitwise the rows a merger that keeps them holds."""
    rng = np.random.default_rng(9)
    gallery, bank, gbank = unit_rows(rng, 300, 8), unit_rows(rng, 500, 8), unit_rows(rng, 200, 8)
    request = make_correction("dualis").statistics_request().merge(make_correction("nnn:k=4").statistics_request())
    tiles = plan_tiles(request, 300, 500, 200, gallery_rows=[70, 200], bank_cols=[120, 400])
    parts = {t: compute_tile(t, gallery, bank if t.side == "query" else gbank, request) for t in tiles}
    keeping = TileMerger(tiles, request, 300, 8)
    for t in tiles:
        keeping.add(t, parts[t])
    want = keeping.result().to_arrays()
    handed: dict = {}
    sinking = TileMerger(tiles, request, 300, 8, sink=lambda side, g0, g1, arrays: handed.setdefault((side, g0, g1), arrays))
    for t in reversed(tiles):
        sinking.add(t, parts[t])
    got = sinking.result().to_arrays()
    assert not sinking.items and {k for k in got} == {"sizes", "query_bank_mean", "gallery_mean", "gallery_bank_mean"}
    for name in ("sizes", "query_bank_mean", "gallery_mean", "gallery_bank_mean"):
        np.testing.assert_array_equal(got[name], want[name])
    assert sorted(handed) == [(s, g0, g1) for s in ("gallery", "query") for g0, g1 in ((0, 70), (70, 200), (200, 300))]
    for name in ("query_topk", "query_lse@20.0", "gallery_lse@20.0"):
        side = name.split("_")[0]
        rows = np.concatenate([handed[(side, g0, g1)][name] for g0, g1 in ((0, 70), (70, 200), (200, 300))])
        np.testing.assert_array_equal(rows, want[name])


def _merged(request, gallery, bank, bank_cols, bank_read=None):
    tiles = plan_tiles(request, len(gallery), len(bank), None, gallery_rows=[300], bank_cols=bank_cols)
    merger = TileMerger(tiles, request, len(gallery), gallery.shape[1])
    for t in reversed(tiles):
        if bank_read:
            n = (len(gallery), len(bank))
            part = compute_tile_streamed(t, lambda a, b: gallery[a:b], lambda a, b: bank[a:b], request, *n, bank_read=bank_read)
        else:
            part = compute_tile(t, gallery, bank, request)
        merger.add(t, part)
    return merger.result().query_lse


@pytest.mark.slow  # 7-25 s measured here
@pytest.mark.parametrize("scale, betas", [(1.0, (20.0, 200.0)), (30.0, (0.5, 1.0, 5.0))])
def test_log_sum_exps_whose_shift_moves_on_float32_overflow(scale, betas):
    """The single pass keeps each row's first-block maximum as its shift and moves it only where
    a term would overflow float32 (here: a first block pointing away from the gallery, later
    blocks towards it; beta 200 on unit vectors, and the expm1 form, beta < 2, on vectors of norm
    30). A tile entering at such a block, or starting at block 0, is bitwise; a tile after one
    enters with the first block's shift and is exact to float rounding."""
    rng = np.random.default_rng(1)
    gallery = unit_rows(rng, 700, 8)

    def towards(sign, n):
        return gallery[rng.integers(0, 700, n)] * sign + 0.05 * rng.standard_normal((n, 8)).astype(np.float32)

    bank = np.concatenate([towards(-1, COL_BLOCK), towards(1, COL_BLOCK), 1.5 * towards(1, COL_BLOCK), towards(1, 900)])
    bank = (bank * scale).astype(np.float32)
    gallery = (gallery * scale).astype(np.float32)
    request = StatisticsRequest(query_betas=frozenset(betas))
    want = compute_statistics(gallery, bank, None, request).query_lse
    for bank_cols, bank_read in (([COL_BLOCK], None), ([COL_BLOCK + 3], None), (len(bank), COL_BLOCK), ([5], COL_BLOCK)):
        got = _merged(request, gallery, bank, bank_cols, bank_read)
        for beta in betas:
            np.testing.assert_array_equal(got[beta], want[beta], err_msg=f"cuts {bank_cols}, beta {beta}")
    got = _merged(request, gallery, bank, [5, 2 * COL_BLOCK + 1])  # the third block's tile: after the move
    for beta in betas:
        np.testing.assert_allclose(got[beta], want[beta], rtol=1e-12)
