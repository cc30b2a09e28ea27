"""The torch engine (issues 20, 39): the device-resident engine (products and reductions on a
torch device, here CPU torch) gives the numpy engine's fits and searches, for blocks that cut
the bank and the gallery unevenly; half precision stays within its documented error; the
default path never imports torch, and a torch device without torch names the extra."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.corrections import make_correction
from hubless.engine import StatisticsRequest, compute_statistics, exact_search, torch_reducers, use_device
from hubless.engine import torch_arrays as ta
from hubless.engine.device import resolve, tf32_enabled
from hubless.engine.torch_reducers import TopKValues, chunk_width, ordered_topk
from tests.conftest import unit_rows

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the models extra)")

#: The torch device the engine's tests run on: CPU torch here; ``HUBLESS_TEST_DEVICE=cuda`` runs
#: the same tests on a GPU (streams, pinned buffers, events), where there is one.
DEVICE = os.environ.get("HUBLESS_TEST_DEVICE", "cpu")
#: Two devices (threads splitting the rows): two GPUs where there are, else the device twice.
PAIR = "cuda:0,cuda:1" if DEVICE.startswith("cuda") and torch.cuda.device_count() > 1 else f"{DEVICE},{DEVICE}"
if DEVICE.startswith("cuda") and not torch.cuda.is_available():
    pytest.skip(f"HUBLESS_TEST_DEVICE={DEVICE} but CUDA is not available", allow_module_level=True)

METHODS = [
    "baseline",
    "nnn:k=5",
    "csls:k=4",
    "dn",
    "is:beta=20.0",
    "is:beta=0.5",
    "dis:k_activation=3",
    "dualis",
    "dualdis:k_activation=2",
    "dualdis:k_activation=2,ungated=exp",
    "gc",
]
#: (rows, columns) of the device blocks: 300 gallery / 1200 and 500 bank rows cut unevenly,
#: and one block over everything; with the top-k of wide rows taken through chunk maxima
#: (chunks of 2 to 4 columns, so small blocks take that path too) or over whole rows
SHAPES = [((37, 101), (2, 4)), (None, None), (None, (2, 4))]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """CPU torch on one thread: on a loaded 2-core machine its thread pool spins for ms per op."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=SHAPES, ids=["uneven-blocks-chunked", "one-block", "one-block-chunked"])
def block_shape(request, monkeypatch):
    shape, chunks = request.param
    monkeypatch.setattr(ta, "BLOCK_SHAPE", shape)
    if chunks is not None:
        monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", chunks)
    return shape


def _same_biases(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(8)
    return {name: unit_rows(rng, n, 32) for name, n in (("gallery", 300), ("query_bank", 1200), ("gallery_bank", 500), ("queries", 80))}


@pytest.mark.parametrize("spec", METHODS)
def test_torch_cpu_fit_and_search_equal_the_numpy_engine(spec, data, block_shape):
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    want = make_correction(spec).fit(g, qb, gb)
    got = make_correction(spec).fit(g, qb, gb, device=DEVICE)
    ws, gs = want.statistics_, got.statistics_
    # torch's and numpy's BLAS may round a dot product differently in the last bit: statistics
    # agree to float32 rounding, and the rankings are the same
    if ws.query_topk is not None:
        np.testing.assert_allclose(gs.query_topk, ws.query_topk, rtol=1e-6, atol=1e-6)
    for beta, values in ws.query_lse.items():
        np.testing.assert_allclose(gs.query_lse[beta], values, rtol=1e-6)
    for beta, values in ws.gallery_lse.items():
        np.testing.assert_allclose(gs.gallery_lse[beta], values, rtol=1e-6)
    for name in ("query_activation", "gallery_activation"):
        if getattr(ws, name) is not None:
            np.testing.assert_array_equal(getattr(gs, name), getattr(ws, name))
    if ws.query_probes is not None:
        np.testing.assert_allclose(gs.query_probes, ws.query_probes, atol=1e-6)
    np.testing.assert_allclose(gs.gallery_mean, ws.gallery_mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gs.query_bank_mean, ws.query_bank_mean, rtol=1e-6, atol=1e-9)
    if hasattr(want, "bias_columns_"):
        _same_biases(got.bias_columns_, want.bias_columns_)
    want_scores, want_ids = want.search(q, 10)
    got_scores, got_ids = got.search(q, 10, device=DEVICE)
    np.testing.assert_array_equal(got_ids, want_ids)  # random unit vectors: no float ties
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("streamed", [False, True], ids=["bank-on-device", "bank-streamed"])
def test_every_statistic_of_one_request_matches_the_numpy_pass(data, block_shape, streamed, monkeypatch):
    """The whole request at once (several betas on both banks, top-k, activation sets, probes
    and the nearest gallery item of every bank item) in one device pass per bank; also with
    the banks streamed from host memory block by block (a bank larger than the device)."""
    monkeypatch.setattr(ta, "STREAM_BANKS", streamed)
    g, qb, gb = data["gallery"], data["query_bank"], data["gallery_bank"]
    request = StatisticsRequest(
        query_topk=7,
        query_betas=frozenset({0.0, 1e-3, 1.0, 20.0, 100.0}),
        gallery_betas=frozenset({5.0, 0.5}),
        query_activation_k=4,
        gallery_activation_k=2,
        query_probes=True,
        query_nearest=True,
    )
    want = compute_statistics(g, qb, gb, request)
    with use_device(DEVICE):
        got = compute_statistics(g, qb, gb, request)
    np.testing.assert_allclose(got.query_topk, want.query_topk, atol=1e-6)
    for side in ("query_lse", "gallery_lse"):
        for beta, values in getattr(want, side).items():
            # the bias is (lse - log n) / beta: 1e-5 of it relative
            np.testing.assert_allclose(getattr(got, side)[beta], values, rtol=1e-7, atol=1e-6 * max(beta, 1e-2))
    for name in ("query_activation", "gallery_activation", "query_nearest"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    for name in ("query_activation_scores", "gallery_activation_scores", "query_nearest_scores", "query_probes"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-6)


def test_ties_go_to_the_lower_id_on_the_device(block_shape, monkeypatch):
    """Exact ties (duplicate gallery rows, integer-valued vectors) are ordered by id, at the
    k-th place too, in searches and activation sets, whatever the column blocks."""
    rng = np.random.default_rng(3)
    base = rng.integers(-2, 3, size=(40, 6)).astype(np.float32)
    gallery = np.concatenate([base, base[::-1], base[:13]])  # every row duplicated, some thrice
    queries = rng.integers(-2, 3, size=(25, 6)).astype(np.float32)
    want = exact_search(queries, gallery, 9)
    with use_device(DEVICE):
        got = exact_search(queries, gallery, 9)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    block = torch.from_numpy(rng.integers(0, 3, size=(30, 50)).astype(np.float32))
    values, ids = ordered_topk(block, 5)
    order = np.lexsort((np.arange(50)[None, :].repeat(30, 0), -block.numpy()), axis=1)[:, :5]
    np.testing.assert_array_equal(ids.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(block.numpy(), order, axis=1))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 90),
    k=st.integers(1, 7),
    levels=st.integers(1, 4),
    chunks=st.sampled_from([(1, 1), (2, 2), (2, 8), (4, 16)]),
    keyed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_top_k_through_chunk_maxima_is_the_top_k_of_the_whole_rows(rows, cols, k, levels, chunks, keyed, seed):
    """The two-step top-k of wide rows (chunk maxima, then the entries of the best chunks)
    gives every row's k best entries in (value descending, id ascending) order, whatever the
    ties (values from a few levels, -inf, -0.0 and +0.0 among them) and a last chunk narrower
    than the others, with the rows' top-k by int64 keys or by torch.topk and a stable sort of
    tied rows; the values-only reducer gives the same values."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, levels + 1, size=(rows, cols)).astype(np.float32) - 1
    values[values == levels - 1] = -np.inf
    values[(values == 0) & (rng.random(values.shape) < 0.5)] = -0.0  # equal to +0.0, as numpy orders them
    k = min(k, cols)
    order = np.lexsort((np.broadcast_to(np.arange(cols), values.shape), -values), axis=1)[:, :k]
    block = torch.from_numpy(values).to(DEVICE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch_reducers, "CHUNK_WIDTHS", chunks)
        patch.setattr(torch_reducers, "KEYED_TOPK_ENTRIES", torch_reducers.KEYED_TOPK_ENTRIES if keyed else 0)
        got_values, got_ids = ordered_topk(block, k)
        out = torch.empty((rows, k), dtype=torch.float32, device=DEVICE)
        state = TopKValues(out, 0, rows, k)
        state.update(block, 0)
        state.finish()
        chunked = chunk_width(block, k)
    if chunks[0] < 2 or 4 * k * chunks[0] > cols:
        assert chunked == 0
    else:
        assert chunks[0] <= chunked <= chunks[1] and 4 * k * chunked <= cols
    np.testing.assert_array_equal(got_ids.cpu().numpy(), order)
    np.testing.assert_array_equal(got_values.cpu().numpy(), np.take_along_axis(values, order, axis=1))
    np.testing.assert_array_equal(out.cpu().numpy(), np.take_along_axis(values, order, axis=1))


def test_the_chunk_width_balances_the_two_top_ks():
    """sqrt(columns / k) rounded to a power of two within CHUNK_WIDTHS; whole rows when the chosen
    chunks would hold more than a quarter of a row or the rows are strided (a transposed block)."""
    wide = torch.empty((3, 50_000))
    assert chunk_width(wide, 11) == 64
    assert chunk_width(torch.empty((3, 100_000)), 10) == 128
    assert chunk_width(wide, 1) == 256 and chunk_width(wide, 1000) == 0
    assert chunk_width(torch.empty((3, 1000)), 10) == 0
    assert chunk_width(torch.empty((50_000, 3)).T, 11) == 0


@pytest.mark.parametrize("where", ["one-device", "bank-streamed", "two-devices"])
def test_activation_sets_from_the_row_pass_keep_ties_at_the_lower_gallery_id(where, block_shape, monkeypatch):
    """The device takes each bank item's nearest gallery items from the gallery x bank blocks
    (a column top-k); with exact ties (duplicate gallery rows, integer vectors: every product
    exact in both orientations) its lists equal the numpy engine's bank x gallery top-k, ties
    to the lower gallery id at the k-th place too, whatever the blocks, a streamed bank or the
    rows split between two devices."""
    monkeypatch.setattr(ta, "STREAM_BANKS", where == "bank-streamed")
    rng = np.random.default_rng(5)
    base = rng.integers(-2, 3, size=(45, 6)).astype(np.float32)
    gallery = np.concatenate([base, base[::-1], base[:17]])  # every row twice, some thrice
    query_bank, gallery_bank = (rng.integers(-2, 3, size=(n, 6)).astype(np.float32) for n in (130, 70))
    request = StatisticsRequest(query_activation_k=5, gallery_activation_k=1, query_nearest=True, query_betas=frozenset({20.0}))
    want = compute_statistics(gallery, query_bank, gallery_bank, request)
    with use_device(PAIR if where == "two-devices" else DEVICE):
        got = compute_statistics(gallery, query_bank, gallery_bank, request)
    for name in ("query_activation", "query_activation_scores", "gallery_activation", "gallery_activation_scores", "query_nearest"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_the_device_reads_each_bank_in_one_product_pass(data, monkeypatch):
    """DIS and DualDIS need, per bank, log-sum-exps of the gallery rows AND each bank item's
    nearest gallery items: on the device both come from one product pass per bank (two passes
    for the two banks, not four), and the fit equals the numpy fit."""
    from hubless.engine import torch_passes

    calls = []
    real = torch_passes.reduce_blocks

    def counting(rows, cols, makers, device, transform=None, **kwargs):
        calls.append((len(rows), len(cols)))
        return real(rows, cols, makers, device, transform, **kwargs)

    monkeypatch.setattr(torch_passes, "reduce_blocks", counting)
    g, qb, gb = data["gallery"], data["query_bank"], data["gallery_bank"]
    request = (
        make_correction("dis:k_activation=3").statistics_request().merge(make_correction("dualdis:k_activation=2").statistics_request())
    )
    with use_device(DEVICE):
        got = compute_statistics(g, qb, gb, request)
    assert calls == [(len(g), len(qb)), (len(g), len(gb))]
    want = compute_statistics(g, qb, gb, request)
    for name in ("query_activation", "gallery_activation"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("spec", ["nnn:k=5", "is:beta=20.0", "dualdis:k_activation=2"])
@pytest.mark.parametrize("streamed", [False, True], ids=["bank-on-device", "bank-streamed"])
def test_a_bank_streamed_in_pieces_equals_one_piece(spec, data, block_shape, streamed, monkeypatch):
    monkeypatch.setattr(ta, "STREAM_BANKS", streamed)
    g, qb, gb = data["gallery"], data["query_bank"], data["gallery_bank"]
    with use_device(DEVICE):
        whole = make_correction(spec).fit(g, qb, gb)
        pieces = make_correction(spec).fit(g, qb[:433], gb[:171])
        pieces.add_query_bank(qb[433:1000]).add_query_bank(qb[1000:])
        if pieces.gallery_bank_use != "ignored":
            pieces.add_gallery_bank(gb[171:])
    _same_biases(pieces.bias_columns_, whole.bias_columns_)
    q = data["queries"]
    np.testing.assert_array_equal(pieces.search(q, 10, device=DEVICE)[1], whole.search(q, 10, device=DEVICE)[1])


def test_gallery_updates_on_the_device_equal_a_fit(data, block_shape):
    g, qb, gb = data["gallery"], data["query_bank"], data["gallery_bank"]
    with use_device(DEVICE):
        whole = make_correction("dualdis:k_activation=2").fit(g, qb, gb)
        grown = make_correction("dualdis:k_activation=2").fit(g[:211], qb, gb).add_items(g[211:], qb, gb)
    np.testing.assert_array_equal(grown.activation_masks_, whole.activation_masks_)
    _same_biases(grown.bias_columns_, whole.bias_columns_)


def test_a_read_only_gallery_stays_on_the_device_between_searches(data):
    gallery = data["gallery"].copy()
    gallery.flags.writeable = False  # nobody can change it in place (a writeable one: tests/engine/test_torch_memory.py)
    corr = hubless.NNN(k=5).fit(gallery, data["query_bank"])
    first = corr.search(data["queries"], 5, device=DEVICE)
    key = (id(corr.gallery_), DEVICE, "float32")
    assert key in ta._KEPT and ta._KEPT[key][0]() is corr.gallery_
    np.testing.assert_array_equal(corr.search(data["queries"], 5, device=DEVICE)[1], first[1])


def test_the_environment_variable_selects_the_device(data, monkeypatch):
    monkeypatch.setenv("HUBLESS_DEVICE", "cpu")
    assert resolve() == ("cpu", "float32")
    got = hubless.NNN(k=5).fit(data["gallery"], data["query_bank"])
    monkeypatch.delenv("HUBLESS_DEVICE")
    assert resolve() == ("numpy", "float32")
    want = hubless.NNN(k=5).fit(data["gallery"], data["query_bank"])
    np.testing.assert_allclose(got.bias_, want.bias_, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("dtype", "bound"), [("bfloat16", 2e-2), ("float16", 2e-3)])
def test_half_precision_products_stay_within_their_documented_error(dtype, bound, data):
    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    want = hubless.NNN(k=5).fit(g, qb)
    with use_device(DEVICE, dtype):
        got = hubless.NNN(k=5).fit(g, qb)
        _, ids = got.search(q, 10)
    assert np.abs(got.bias_ - want.bias_).max() < bound
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, want.search(q, 10)[1])])
    assert overlap >= (0.9 if dtype == "bfloat16" else 0.98)


def test_bad_devices_and_dtypes_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve("gpu0")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve("cpu", "float8")
    with pytest.raises(ValueError, match="dtype float16 needs a torch device"):
        resolve("numpy", "float16")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve("cuda")


def test_tf32_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("HUBLESS_TF32", raising=False)
    assert not tf32_enabled()
    with use_device(None, tf32=True):
        assert tf32_enabled()
    monkeypatch.setenv("HUBLESS_TF32", "1")
    assert tf32_enabled()
    with use_device(DEVICE, tf32=False):
        assert not tf32_enabled()
    # on CUDA the products follow the setting and torch's flag is restored after (the flag exists
    # on CPU torch too; no CUDA is needed to set it)
    from hubless.engine.device import tf32_products

    before = torch.backends.cuda.matmul.allow_tf32
    with use_device(None, tf32=not before), tf32_products("cuda:0"):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before
    with use_device(None, tf32=True), tf32_products("cpu"):
        assert torch.backends.cuda.matmul.allow_tf32 is before  # other devices: untouched


def test_a_torch_device_without_torch_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, hubless\n"
        "x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)\n"
        "try:\n"
        "    hubless.NNN(k=3).fit(x, x, device='cuda')\n"
        "except hubless.errors.MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True).stdout
    assert "the torch engine (device='cuda') needs torch: pip install 'hubless[models]'" in out


def test_the_default_path_never_imports_torch(tmp_path):
    code = (
        "import sys, numpy as np, hubless\n"
        "x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)\n"
        "hubless.NNN(k=3).fit(x, x).search(x[:5], 3)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_the_ranking_pass_counts_in_column_chunks(data, monkeypatch):
    """The eager ranking pass sums its 0/1 flags in column chunks when the gallery is wider than
    a float32 sum counts exactly (2^24 columns; 7 here): the ranks are numpy's."""
    from hubless.engine import torch_ranking

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    g = np.concatenate([g, g[:40]])  # exact duplicates: ties
    truth = [[i, 300 + i % 40] if i % 3 else [i] for i in range(len(q))]
    methods = ["nnn:k=5", "is:beta=20.0", "dis:k_activation=3"]
    kwargs = dict(bootstrap=0, ties="average", progress=False)
    want = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
    monkeypatch.setattr(torch_ranking, "EXACT_FLOAT_COUNT", 7)
    with use_device(DEVICE):
        got = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
    for w, o in zip(want.results, got.results):
        assert o.metrics == w.metrics and o.hubness == w.hubness, w.method
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


@pytest.mark.parametrize("ties", ["index", "index-running-sums", "average", "optimistic"])
def test_evaluate_ranks_on_the_device_equal_the_numpy_ranks(ties, data, monkeypatch):
    """evaluate streams its ranks of the truth, R@K and hubness counts on the device (additive
    methods whole there, GC and published DualDIS ranked on the host from device blocks)."""
    from hubless.engine import torch_ranking

    if ties == "index-running-sums":  # a GPU's count of the equal scores up to each relevant item
        monkeypatch.setattr(torch_ranking, "RUNNING_TIE_COUNTS", True)
        ties = "index"
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 101))  # query blocks that cut the 80 queries unevenly
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    truth = [[i, 100 + 2 * i] if i % 3 else [i] for i in range(len(q))]  # one or two relevant items
    methods = ["nnn:k=5", "dis:k_activation=3", "dualdis:k_activation=2", "gc"]
    kwargs = dict(gallery_bank=gb, bootstrap=0, ties=ties, progress=False)
    want = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
    with use_device(DEVICE):
        got = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
    for w, o in zip(want.results, got.results):
        assert o.method == w.method
        assert 0 < o.seconds["search"] < 60  # each ranking's own time on the device (CUDA events there)
        assert o.metrics == pytest.approx(w.metrics, rel=1e-9), w.method
        assert o.hubness == pytest.approx(w.hubness, rel=1e-9), w.method  # from the top-10 ids of every query
        np.testing.assert_array_equal(o.n1, w.n1)
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


@pytest.fixture
def fresh_compile(monkeypatch):
    """The compiled kernels of the ranking pass, forgetting an earlier test's compiler failure."""
    from hubless.engine import torch_fused

    monkeypatch.setattr(torch_fused, "_STATE", {})
    return torch_fused


@pytest.mark.slow
@pytest.mark.parametrize("ties", ["index", "average", "optimistic"])
def test_the_compiled_ranking_pass_gives_the_numpy_ranks(ties, data, fresh_compile, monkeypatch):
    """With HUBLESS_COMPILE the ranking pass counts and takes its top ids by torch.compile's
    kernels (the scores never written): ranks, R@K, hubness and N_1 bitwise those of the numpy
    engine, for a bias row (NNN, CSLS), per-query products (DIS's gates), a host ranking (GC),
    the baseline, one or two relevant items per query and exact ties (duplicate gallery items)."""
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    g = np.concatenate([g, g[:40]])  # exact duplicates: ties ranked by the convention
    truth = [[i, 300 + i % 40] if i % 3 else [i] for i in range(len(q))]
    methods = ["nnn:k=5", "csls:k=4", "dis:k_activation=3", "dualdis:k_activation=2,ungated=exp", "gc"]
    kwargs = dict(gallery_bank=gb, bootstrap=0, ties=ties, progress=False)
    want = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
    calls = []
    real = fresh_compile.compiled_rankings_counts
    monkeypatch.setattr(fresh_compile, "compiled_rankings_counts", lambda *a: calls.append(real(*a)) or calls[-1])
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 101))  # query blocks that cut the 80 queries unevenly
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))  # top ids through chunk maxima here too
    with use_device(DEVICE, compiled=True):
        got = hubless.evaluate(g, q, truth, qb, methods, **kwargs)
        one_each = hubless.evaluate(g, q, np.arange(len(q)) * 4, qb, methods, **kwargs)  # one relevant item per query
    assert calls and all(c is not None for c in calls)  # compiled, no fallback
    pairs = [(want, got), (hubless.evaluate(g, q, np.arange(len(q)) * 4, qb, methods, **kwargs), one_each)]
    for w, o in ((w, o) for want_all, got_all in pairs for w, o in zip(want_all.results, got_all.results)):
        assert o.method == w.method
        assert o.metrics == w.metrics and o.hubness == w.hubness, w.method
        np.testing.assert_array_equal(o.n1, w.n1)
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


def test_the_compiled_counts_of_several_rankings_are_one_graph(fresh_compile):
    """torch.compile traces every ranking's counts and chunk maxima of a block as one graph (a
    graph break would split the kernels, each reading the block again): no call it cannot trace
    (such as an import) on the way."""
    from hubless.engine.torch_arrays import torch_module

    torch_module()  # the engine's first use imports torch; the kernels run after it
    rng = np.random.default_rng(0)
    base = torch.from_numpy(rng.standard_normal((5, 70), dtype=np.float32))
    row = torch.from_numpy(rng.standard_normal(70, dtype=np.float32))
    gates = torch.tensor([True, False, True, True, False])
    minuses = [None, row, (gates, row)]  # nothing, a row, a row where the gate is open
    c = torch.from_numpy(rng.integers(0, 70, 5))
    targets = [base[torch.arange(5), c][:, None] - shift for shift in (0, row[c][:, None], torch.where(gates, row[c], 0.0)[:, None])]
    explained = torch._dynamo.explain(fresh_compile.rankings_counts)(base, minuses, None, targets, 8, c[:, None])
    assert explained.graph_break_count == 0 and explained.graph_count == 1, [b.reason for b in explained.break_reasons]


def test_the_compiled_pass_compiles_once_for_blocks_of_any_rows(data, fresh_compile, monkeypatch):
    """The rankings counted together are one compiled graph for every block of a pass, the last
    shorter block included (a view cut from a 2-d buffer made torch.compile recompile for it):
    80 queries in blocks of 23 rows, the baseline, NNN and IS counted together, one graph."""
    graphs = []

    def counting(gm, example_inputs):  # a backend that counts the graphs and runs them as traced
        graphs.append(gm)
        return gm.forward

    real_compile = fresh_compile.torch.compile
    monkeypatch.setattr(fresh_compile.torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": counting}))
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 301))
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))
    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    want = hubless.evaluate(g, q, np.arange(len(q)), qb, ["nnn:k=5", "is:beta=20.0"], bootstrap=0, progress=False)
    torch._dynamo.reset()
    try:
        with use_device(DEVICE, compiled=True):
            got = hubless.evaluate(g, q, np.arange(len(q)), qb, ["nnn:k=5", "is:beta=20.0"], bootstrap=0, progress=False)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    for w, o in zip(want.results, got.results):
        assert o.metrics == pytest.approx(w.metrics, rel=1e-9), w.method


@pytest.mark.slow
@pytest.mark.skipif(DEVICE != "cpu", reason="a counting clock stands in for the host clock of a CPU device")
def test_the_compiled_pass_charges_rankings_counted_together_an_equal_share(fresh_compile, monkeypatch):
    """Compiled, the rankings that are the raw scores less nothing or one row are counted
    together, at most COUNTED_TOGETHER at a time (2 here); each is charged the block's product
    and an equal share of its group's count. With a clock that ticks one second per mark and one
    block: the baseline and a one-row ranking (one group) cost 1 + 1/2 s each, a second one-row
    ranking (a group of its own) and a ranking with per-query weights (counted alone) 1 + 1 s,
    and the ranks are those of each ranking counted alone (the eager passes)."""
    from hubless.engine import torch_ranking

    monkeypatch.setattr(ta, "BLOCK_SHAPE", (6, 20))
    rng = np.random.default_rng(3)
    q, g = unit_rows(rng, 6, 4), unit_rows(rng, 20, 4)
    bias = rng.standard_normal((20, 1)).astype(np.float32)
    rankers = [(np.full((6, 1), w, np.float32), bias) for w in (0.0, 0.5, -0.25)] + [(rng.random((6, 1), np.float32), bias)]
    truth = rng.integers(0, 20, 6)

    def ranked(compiled):
        with use_device(DEVICE, compiled=compiled):
            return torch_ranking.rank_queries(
                q, g, rankers, np.arange(6), np.arange(7), truth, ties="index", depth=2, device=DEVICE, dtype="float32"
            )

    want = ranked(False)
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))  # top ids through chunk maxima, as compiled
    monkeypatch.setattr(torch_ranking, "COUNTED_TOGETHER", 2)
    ticks = iter(range(1000))
    monkeypatch.setattr(torch_ranking.Stopwatch, "mark", lambda self: float(next(ticks)))
    got = ranked(True)
    assert [seconds for _, _, seconds in got] == [1.5, 1.5, 2.0, 2.0]
    for (ranks, top, _), (want_ranks, want_top, _) in zip(got, want):
        np.testing.assert_array_equal(ranks, want_ranks)
        np.testing.assert_array_equal(top, want_top)


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="the host waits only for a CUDA device (CPU torch works as it is called)")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_ranking_pass_never_waits_for_the_device_inside_a_block(compiled, data, fresh_compile, monkeypatch):
    """On a GPU the ranking of a block (six methods' counts, index ties, DIS's gates, top ids)
    queues work without waiting for the device (torch's sync debug mode turns any wait into an
    error): a wait per ranking and block leaves the GPU idle while the host catches up. A first
    evaluation compiles and tunes the kernels (which waits); the second is checked."""
    from hubless.engine import torch_ranking

    real = torch_ranking._RankingPass.rank
    strict = []

    def checked(self, *args):
        torch.cuda.set_sync_debug_mode("error" if strict else 0)
        try:
            return real(self, *args)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(torch_ranking._RankingPass, "rank", checked)
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 301))  # query blocks that cut the 80 queries unevenly
    monkeypatch.setattr(torch_reducers, "CHUNK_WIDTHS", (2, 8))  # top ids through chunk maxima
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    methods = ["nnn:k=5", "csls:k=4", "dn", "is:beta=20.0", "dis:k_activation=3", "dualis"]
    kwargs = dict(gallery_bank=gb, bootstrap=0, progress=False)
    want = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, **kwargs)
    with use_device(DEVICE, compiled=compiled):
        hubless.evaluate(g, q, np.arange(len(q)), qb, methods, **kwargs)
        strict.append(True)
        got = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, **kwargs)
    for w, o in zip(want.results, got.results):
        assert o.metrics == pytest.approx(w.metrics, rel=1e-9), w.method


@pytest.mark.parametrize("device", ["one", "two"])
def test_evaluate_on_the_device_takes_the_gates_from_the_ranking_pass(device, data, monkeypatch):
    """The gated methods' raw top-1 (DIS, DualDIS) comes from the ranking pass's own blocks, as
    in the numpy pass: no search of the queries (CSLS, whose ranking needs none of its r_q,
    causes none either), on one device or with the queries split between two. The gates of
    DIS and the bias form of DualDIS are formed on the device (no block's neighbours go to the
    host for them). The metrics equal the numpy engine's."""
    from hubless.corrections import AdditiveCorrection
    from hubless.engine import torch_passes

    searched = []
    real = torch_passes.exact_search

    def counting(queries, gallery, top_k, **kwargs):
        searched.append(top_k)
        return real(queries, gallery, top_k, **kwargs)

    monkeypatch.setattr(torch_passes, "exact_search", counting)
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    methods = ["nnn:k=5", "csls:k=4", "dis:k_activation=3", "dualdis:k_activation=2", "dualdis:k_activation=2,ungated=exp"]
    kwargs = dict(gallery_bank=gb, bootstrap=0, progress=False)
    want = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, **kwargs)
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 101))  # query blocks that cut the 80 queries unevenly
    on_host = []
    monkeypatch.setattr(AdditiveCorrection, "weights_from_neighbours", lambda self, *a: on_host.append(self.name))
    with use_device(DEVICE if device == "one" else PAIR):
        got = hubless.evaluate(g, q, np.arange(len(q)), qb, methods, **kwargs)
    assert searched == [] and on_host == []
    for w, o in zip(want.results, got.results):
        assert o.metrics == pytest.approx(w.metrics, rel=1e-9), w.method
        assert o.hubness == pytest.approx(w.hubness, rel=1e-9), w.method


def test_rank_counts_beyond_the_exact_float_width_are_summed_in_chunks(data, monkeypatch):
    """The device counts ranks by float sums of 0/1 flags, exact up to 2^24 columns; a wider
    gallery is counted in chunks (here 7 columns wide) and gives the numpy engine's ranks."""
    from hubless.engine import torch_ranking

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    truth = [[i, 100 + 2 * i] if i % 3 else [i] for i in range(len(q))]
    want = hubless.evaluate(g, q, truth, qb, ["nnn:k=5"], bootstrap=0, progress=False)
    monkeypatch.setattr(torch_ranking, "EXACT_FLOAT_COUNT", 7)
    with use_device(DEVICE):
        got = hubless.evaluate(g, q, truth, qb, ["nnn:k=5"], bootstrap=0, progress=False)
    for w, o in zip(want.results, got.results):
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


@pytest.mark.parametrize("spec", ["nnn:k=5", "csls:k=4", "is:beta=20.0"])
def test_one_weight_for_every_query_subtracts_one_row_with_the_same_scores(spec, data, monkeypatch):
    """With one weight for every query the device subtracts one precomputed row per block
    instead of a per-query outer product: the same float32 products, so the ranking pass's
    ranks are bitwise those of the per-query form. The search adds the row in the product
    (addmm): on a GPU cuBLASLt's bias epilogue may sum the product in another order (measured
    on an H100: up to 2e-6 apart at scores of 1.5), so its scores are the per-query form's to
    float32 rounding and the ids the same (random vectors: no near ties)."""
    from hubless.engine import torch_passes, torch_ranking

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    fitted = make_correction(spec).fit(g, qb)
    got = fitted.search(q, 10, device=DEVICE)
    kwargs = dict(bootstrap=0, progress=False, device=DEVICE)
    got_eval = hubless.evaluate(g, q, np.arange(len(q)), qb, [spec], **kwargs)
    monkeypatch.setattr(torch_passes, "one_row", lambda *args: None)
    monkeypatch.setattr(torch_ranking, "one_row", lambda *args: None)
    want = fitted.search(q, 10, device=DEVICE)
    want_eval = hubless.evaluate(g, q, np.arange(len(q)), qb, [spec], **kwargs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)  # as the numpy and device searches
    np.testing.assert_array_equal(got[1], want[1])
    for w, o in zip(want_eval.results, got_eval.results):
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


@pytest.mark.filterwarnings("ignore::hubless.UnnormalizedEmbeddingsWarning")
@pytest.mark.parametrize("running", [True, False], ids=["running-sums", "second-look"])
@pytest.mark.parametrize("exact_width", [None, 7], ids=["one-chunk", "7-column-chunks"])
def test_evaluate_ranks_ties_by_index_on_the_device(running, exact_width, monkeypatch):
    """Exact ties (every gallery item twice) rank by index on the device as on the host, with
    the equal scores up to each relevant item counted by running sums (a GPU's way) or by a
    second look at the rows with ties (the other devices' way), also when the counts go in
    chunks (a gallery wider than a float32 sum counts exactly, 7 columns here). The vectors are small integers and half-integers, not
    normalised: every product is exact in any summation order, so the ties are ties on a GPU
    too (cuBLAS may sum two equal columns of normalised vectors in different orders, a last-bit
    difference that is no longer a tie)."""
    from hubless.engine import torch_ranking

    monkeypatch.setattr(torch_ranking, "RUNNING_TIE_COUNTS", running)
    if exact_width:
        monkeypatch.setattr(torch_ranking, "EXACT_FLOAT_COUNT", exact_width)
    rng = np.random.default_rng(5)
    base = rng.integers(-2, 3, size=(30, 6)).astype(np.float32)
    gallery = np.concatenate([base, base])  # every item twice: exact ties
    queries = rng.integers(-2, 3, size=(40, 6)).astype(np.float32) + 0.5
    truth = rng.integers(0, 60, size=40)
    kwargs = dict(bootstrap=0, progress=False, normalize=False)
    want = hubless.evaluate(gallery, queries, truth, None, ["baseline"], **kwargs)
    with use_device(DEVICE):
        got = hubless.evaluate(gallery, queries, truth, None, ["baseline"], **kwargs)
    for name, values in want.results[0].per_query.items():
        np.testing.assert_array_equal(got.results[0].per_query[name], values)
    assert got.results[0].metrics == want.results[0].metrics


def test_tune_on_the_device_chooses_what_numpy_chooses(data):
    g, qb = data["gallery"], data["query_bank"]
    q = g[:80] + 0.9 * data["queries"]  # near their truth: R@1 well above 0
    truth = np.arange(len(q))
    grids = {"nnn": {"alpha": (0.25, 0.75), "k": (3, 8)}, "is": {"beta": (5.0, 20.0)}}
    want = hubless.tune(g, q, truth, qb, ["nnn", "is"], grids=grids, progress=False)
    got = hubless.tune(g, q, truth, qb, ["nnn", "is"], grids=grids, progress=False, device=DEVICE)
    assert repr(got) == repr(want)


def test_several_devices_split_the_rows_and_merge_to_the_single_device_result(data, monkeypatch):
    """device="cpu,cpu" (as "cuda:0,cuda:1"): each device takes a share of the rows (gallery
    rows for the statistics, bank rows for the activation sets, queries for search and
    evaluate); the merged results equal the numpy engine's."""
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (37, 101))
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    assert resolve(["cpu", "cpu"]) == ("cpu,cpu", "float32")
    request = StatisticsRequest(query_topk=5, query_betas=frozenset({20.0}), query_activation_k=3, query_probes=True, query_nearest=True)
    want = compute_statistics(g, qb, gb, request)
    with use_device(PAIR):
        got = compute_statistics(g, qb, gb, request)
    np.testing.assert_allclose(got.query_topk, want.query_topk, atol=1e-6)
    np.testing.assert_allclose(got.query_lse[20.0], want.query_lse[20.0], rtol=1e-7)
    for name in ("query_activation", "query_nearest"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    np.testing.assert_allclose(got.query_probes, want.query_probes, atol=1e-6)
    for spec in ("dis:k_activation=3", "gc"):
        fitted = make_correction(spec).fit(g, qb, gb)
        np.testing.assert_array_equal(fitted.search(q, 10, device=PAIR)[1], fitted.search(q, 10)[1])
    truth = np.arange(len(q))
    ev = [hubless.evaluate(g, q, truth, qb, ["nnn:k=5", "gc"], bootstrap=0, progress=False, device=d) for d in ("numpy", PAIR)]
    assert [r.metrics for r in ev[1].results] == [r.metrics for r in ev[0].results]


@pytest.mark.parametrize("spec", ["nnn:k=5", "is:beta=20.0", "dis:k_activation=3", "dualdis:k_activation=2", "gc"])
def test_score_matrix_fits_on_the_device_equal_the_numpy_fits(spec, data, monkeypatch):
    """fit_scores (score matrices, not embeddings) with a torch device: each block of bank rows
    is read and checked on the host, reduced on the device (rows cut by a small block budget)."""
    from hubless.engine import score_statistics

    monkeypatch.setattr(score_statistics, "SCORE_BLOCK_ELEMENTS", 300 * 97)  # 97 bank rows a block
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    sb, sg = qb @ g.T, gb @ g.T
    want = make_correction(spec).fit_scores(sb, sg)
    with use_device(DEVICE):
        got = make_correction(spec).fit_scores(sb, sg)
    ws, gs = want.statistics_, got.statistics_
    for name in ("query_topk", "query_probes"):
        if getattr(ws, name) is not None:
            np.testing.assert_allclose(getattr(gs, name), getattr(ws, name), atol=1e-7)
    for side in ("query_lse", "gallery_lse"):
        for beta, values in getattr(ws, side).items():
            np.testing.assert_allclose(getattr(gs, side)[beta], values, rtol=1e-7)
    for name in ("query_activation", "gallery_activation"):
        if getattr(ws, name) is not None:
            np.testing.assert_array_equal(getattr(gs, name), getattr(ws, name))
    scores = q @ g.T
    np.testing.assert_array_equal(
        np.argsort(-got.correct(scores), axis=1, kind="stable"), np.argsort(-want.correct(scores), axis=1, kind="stable")
    )


@pytest.mark.parametrize("ties", ["index", "average", "optimistic"])
def test_score_matrix_evaluation_ranks_on_the_device_as_numpy_does(ties, data, tmp_path, monkeypatch):
    """hubless.score_matrices.evaluate_scores (hubless eval --scores) with a torch device: each block of
    score rows is read and checked on the host, uploaded once and ranked there by every method
    (additive, gated DIS / DualDIS with their gates from the rows, GC and published DualDIS on
    the host); ranks, metrics and hubness equal the numpy pass's, rows read from a memory map and
    a subset of rows (a query mask) included."""
    from hubless.score_matrices import evaluate_scores

    monkeypatch.setattr(ta, "BLOCK_SHAPE", (23, 101))  # 80 rows cut unevenly
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    np.save(tmp_path / "scores.npy", q @ g.T)
    scores = np.load(tmp_path / "scores.npy", mmap_mode="r")
    truth = [[i, 100 + 2 * i] if i % 3 else [i] for i in range(len(q))]
    methods = [
        "nnn:k=5",
        "csls:k=4",
        "is:beta=20.0",
        "dis:k_activation=3",
        "dualdis:k_activation=2",
        "dualdis:k_activation=2,ungated=exp",
        "gc",
    ]
    mask = np.arange(len(q)) % 5 != 2
    kwargs = dict(gallery_bank_scores=gb @ g.T, bootstrap=0, ties=ties, query_mask=mask, progress=False)
    want = evaluate_scores(scores, truth, qb @ g.T, methods, **kwargs)
    from hubless.engine import torch_ranking

    ranked_on_device = []
    real = torch_ranking.rank_score_rows
    monkeypatch.setattr(torch_ranking, "rank_score_rows", lambda *a, **k: ranked_on_device.append(1) or real(*a, **k))
    got = evaluate_scores(scores, truth, qb @ g.T, methods, device=DEVICE, **kwargs)
    assert ranked_on_device == [1]
    for w, o in zip(want.results, got.results):
        assert o.metrics == pytest.approx(w.metrics, rel=1e-9), w.method
        assert o.hubness == pytest.approx(w.hubness, rel=1e-9), w.method
        for name, values in w.per_query.items():
            np.testing.assert_array_equal(o.per_query[name], values)


@pytest.mark.parametrize("ranking", [False, True], ids=["method-scores", "ranking-scores"])
def test_correct_scores_top_k_ranks_on_the_device_as_on_the_host(ranking, data, block_shape, monkeypatch):
    """correct_scores(..., top_k=) with a torch device: an additive method's rows are ranked there
    (raw neighbours, bias, top-k) and only the top k come back, the same values and ids as the host
    path (the correction fitted on the host for both, so the rows' ranking is what is compared);
    GC and published DualDIS are ranked on the host. Blocks of 23 rows."""
    from hubless.engine import torch_ranking
    from hubless.score_matrices import correct, correct_scores

    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    S, SB, SG = q @ g.T, qb @ g.T, gb @ g.T
    fit = correct.fit_on_scores

    def fit_on_the_host(*args, **kwargs):
        with use_device("numpy"):
            return fit(*args, **kwargs)

    monkeypatch.setattr(correct, "fit_on_scores", fit_on_the_host)
    monkeypatch.setattr(correct, "RANK_BLOCK_ELEMENTS", 23 * S.shape[1])
    ranked = []
    real = torch_ranking.corrected_top_k
    monkeypatch.setattr(torch_ranking, "corrected_top_k", lambda *a, **k: ranked.append(1) or real(*a, **k))
    on_the_host = ("gc", "dualdis:k_activation=2")  # not exactly additive (published DualDIS)
    for spec in ("nnn:k=5", "csls:k=4", "is:beta=20.0", "dis:k_activation=3", "dualis", "dualdis:k_activation=2,ungated=exp", *on_the_host):
        ranked.clear()
        want = correct_scores(S, SB, spec, gallery_bank_scores=SG, top_k=9, ranking=ranking)
        got = correct_scores(S, SB, spec, gallery_bank_scores=SG, top_k=9, ranking=ranking, device=DEVICE)
        assert len(ranked) == (0 if spec in on_the_host else 4), spec  # 80 rows: 4 blocks on the device
        np.testing.assert_array_equal(got[1], want[1], err_msg=spec)
        np.testing.assert_array_equal(got[0], want[0], err_msg=spec)


def test_read_only_arrays_go_to_the_device_without_a_warning(data):
    """Memory maps and a loaded index's arrays are read-only: torch's warning about them would
    reach users (the engine never writes into those tensors)."""
    import warnings

    g, qb, q = (data[name].copy() for name in ("gallery", "query_bank", "queries"))
    for array in (g, qb, q):
        array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corr = hubless.NNN(k=5).fit(g, qb, device=DEVICE)
        corr.search(q, 5, device=DEVICE)


def test_streamed_blocks_are_the_array_in_order_and_leaving_early_is_safe():
    """The staging buffers (pinned on CUDA) are reused every second block: each block seen is
    exactly its rows, whatever the block size, and the generator may be left early."""
    rng = np.random.default_rng(2)
    array = rng.standard_normal((103, 9)).astype(np.float32)
    for block in (1, 10, 103, 500):
        # copies queued on the device, read back once at the end: a staging buffer overwritten
        # before the device read it would show here
        seen = [(c0, c1, rows.clone()) for c0, c1, rows in ta.Streamed(array, DEVICE, "float32", block).blocks()]
        assert [c0 for c0, _, _ in seen] == list(range(0, 103, min(block, 103)))
        np.testing.assert_array_equal(torch.cat([rows for _, _, rows in seen]).cpu().numpy(), array)
    blocks = ta.Streamed(array, DEVICE, "bfloat16", 10).blocks()
    c0, c1, rows = next(blocks)
    assert rows.dtype == torch.bfloat16 and (c0, c1) == (0, 10)
    blocks.close()


def test_several_devices_with_a_streamed_bank_equal_the_numpy_pass(data, monkeypatch):
    monkeypatch.setattr(ta, "BLOCK_SHAPE", (37, 101))
    monkeypatch.setattr(ta, "STREAM_BANKS", True)
    g, qb, gb = data["gallery"], data["query_bank"], data["gallery_bank"]
    request = StatisticsRequest(query_topk=5, query_betas=frozenset({20.0}), gallery_activation_k=2, query_probes=True, query_nearest=True)
    want = compute_statistics(g, qb, gb, request)
    with use_device(PAIR):
        got = compute_statistics(g, qb, gb, request)
    np.testing.assert_allclose(got.query_topk, want.query_topk, atol=1e-6)
    np.testing.assert_allclose(got.query_lse[20.0], want.query_lse[20.0], rtol=1e-7)
    np.testing.assert_allclose(got.query_probes, want.query_probes, atol=1e-6)
    for name in ("gallery_activation", "query_nearest"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["gallery", "query_bank"])
def test_a_device_fit_checks_its_input_on_the_device_with_the_host_messages(bad, where, data):
    """On a torch device the input's one full pass (row norms: finite, scale, normalisation) runs
    on the device after the upload; a NaN / Inf is refused with the host check's error."""
    arrays = {"gallery": data["gallery"].copy(), "query_bank": data["query_bank"].copy()}
    arrays[where][[7, 41], 3] = bad
    with pytest.raises(hubless.errors.InvalidInput) as on_host:
        hubless.NNN(k=5).fit(arrays["gallery"], arrays["query_bank"])
    with pytest.raises(hubless.errors.InvalidInput) as on_device:
        hubless.NNN(k=5).fit(arrays["gallery"], arrays["query_bank"], device=DEVICE)
    assert str(on_device.value) == str(on_host.value)
    assert f"{where} contains NaN or Inf in 2 row(s) (first: row 7)" in str(on_device.value)


@pytest.mark.parametrize("where", ["gallery", "queries", "query_bank"])
def test_evaluate_on_a_device_checks_its_inputs_there_with_the_host_messages(where, data, monkeypatch):
    """evaluate on a torch device checks its inputs (row norms) on the device, as a device fit
    does: a NaN is refused with the host check's message, and good inputs are measured there."""
    from hubless.engine import torch_arrays

    arrays = {"gallery": data["gallery"], "queries": data["queries"], "query_bank": data["query_bank"]}
    truth = np.arange(len(arrays["queries"]))
    measured = []
    real = torch_arrays.row_norms
    monkeypatch.setattr(torch_arrays, "row_norms", lambda array, device: measured.append(len(array)) or real(array, device))
    with use_device(DEVICE):
        hubless.evaluate(arrays["gallery"], arrays["queries"], truth, arrays["query_bank"], ["nnn:k=5"], bootstrap=0, progress=False)
    assert {len(a) for a in arrays.values()} <= set(measured)
    bad = {**arrays, where: arrays[where].copy()}
    bad[where][[3, 9], 1] = np.nan
    errors = []
    for on in ("numpy", DEVICE):
        with pytest.raises(hubless.errors.InvalidInput) as caught:
            hubless.evaluate(bad["gallery"], bad["queries"], truth, bad["query_bank"], ["nnn:k=5"], bootstrap=0, progress=False, device=on)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert f"{where} contains NaN or Inf in 2 row(s) (first: row 3)" in errors[1]


def test_a_device_search_checks_its_queries_there(data, monkeypatch):
    """search on a torch device measures the queries' row norms on the device (as a fit does;
    the search then uses that upload); a NaN query is refused with the host check's message."""
    from hubless.engine import torch_arrays

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    fitted = make_correction("nnn:k=5").fit(g, qb)
    want = fitted.search(q, 10)
    measured = []
    real_norms = torch_arrays.row_norms
    monkeypatch.setattr(torch_arrays, "row_norms", lambda array, device: measured.append(len(array)) or real_norms(array, device))
    got = fitted.search(q, 10, device=DEVICE)
    assert measured == [len(q)]
    np.testing.assert_array_equal(got[1], want[1])
    bad = q.copy()
    bad[4, 2] = np.nan
    errors = []
    for on in (None, DEVICE):
        with pytest.raises(hubless.errors.InvalidInput) as caught:
            fitted.search(bad, 10, device=on)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "queries contains NaN or Inf in 1 row(s) (first: row 4)" in errors[0]


def test_tune_on_a_device_checks_its_inputs_there(data, monkeypatch):
    from hubless.engine import torch_arrays

    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    measured = []
    real = torch_arrays.row_norms
    monkeypatch.setattr(torch_arrays, "row_norms", lambda array, device: measured.append(len(array)) or real(array, device))
    hubless.tune(g, q, np.arange(len(q)), qb, ["nnn"], grids={"nnn": {"k": [5]}}, progress=False, device=DEVICE)
    assert {len(g), len(q), len(qb)} <= set(measured)


def test_a_device_fit_normalises_as_the_host_and_reuses_the_checked_upload(data):
    """Rows that are not unit length (float64, scaled) are normalised from the device's norms
    (the upload normalised with them: tests/engine/test_torch_memory.py); unit rows keep the
    array, and the fit's passes use the upload the check made."""
    from hubless._validation import as_embeddings
    from hubless.engine.device import checked_on_device

    g, qb = (data[name].astype(np.float64) * 3.0 for name in ("gallery", "query_bank"))
    want = hubless.NNN(k=5).fit(g, qb)
    got = hubless.NNN(k=5).fit(g, qb, device=DEVICE)
    np.testing.assert_allclose(got.gallery_, want.gallery_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.bias_, want.bias_, rtol=1e-5, atol=1e-6)
    unit = data["gallery"]
    with use_device(DEVICE), checked_on_device():
        checked = as_embeddings(unit, "gallery", normalize=True)
        assert checked is unit
        assert ta.put(unit, DEVICE, "float32") is ta.put(checked, DEVICE, "float32")
        key = (id(unit), DEVICE, "float32")
        assert ta._SCOPE.get()[key][0]() is unit  # uploaded by the check, found by the passes
    with checked_on_device():  # no torch device in effect: the host pass, nothing uploaded
        assert ta._SCOPE.get() is None
