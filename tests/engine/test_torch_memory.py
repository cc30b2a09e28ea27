"""What the torch engine holds on the device (issue 51): GC's sorted probes stay within the
block budget (they took rows x the whole bank, and the score-matrix fit the whole gallery x
bank), measured with torch's profiler on CPU torch (every tensor the engine allocates); each
input is uploaded once, also when the check normalises it; a device copy never serves rows
changed in place."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.engine import torch_arrays as ta
from hubless.engine import use_device
from tests.conftest import unit_rows

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the models extra)")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

#: The device's block budget in these tests (similarities per block), small against the bank.
BUDGET = 2**14


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(ta, "BLOCK_ELEMENTS", {"cuda": BUDGET, "other": BUDGET})
    monkeypatch.setattr(ta, "BLOCK_SHAPE", None)
    yield
    torch.set_num_threads(before)


def largest_allocation(work) -> int:
    """The most bytes any one torch operation kept allocated while ``work()`` ran (torch's
    profiler: each operation's own allocations less its own frees), and what ``work`` returned."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = work()
    return max((e.self_cpu_memory_usage for e in prof.events()), default=0), result


#: A sort keeps its values (float32) and their positions (int64): 12 bytes per entry; a block
#: budget of such entries is the most one operation may hold.
BOUND = 3 * 4 * BUDGET


@pytest.mark.parametrize("streamed", [False, True])
def test_gc_probes_on_the_device_stay_within_the_block_budget(streamed, monkeypatch):
    """A bank of 5,000 against a budget of 16,384 similarities: the probe rows of a block used
    to be 64 rows x the whole bank (19.5x the budget, 58x with the sort's positions); now each
    block holds as many whole rows as the budget does, and the fit equals numpy's."""
    monkeypatch.setattr(ta, "STREAM_BANKS", streamed)
    rng = np.random.default_rng(5)
    gallery, bank = unit_rows(rng, 200, 16), unit_rows(rng, 5000, 16)
    want = hubless.make_correction("gc").fit(gallery, bank)
    peak, got = largest_allocation(lambda: hubless.make_correction("gc").fit(gallery, bank, device="cpu"))
    assert peak <= BOUND, f"{peak / (4 * BUDGET):.1f}x the block budget"
    np.testing.assert_allclose(got.probes_, want.probes_, atol=1e-6)


def test_gc_probes_longer_than_a_block_are_sorted_on_the_host(monkeypatch):
    """A bank wider than the whole budget: not even one row fits, so the rows gather on the host
    (nothing of a row's size on the device) and are sorted there."""
    monkeypatch.setattr(ta, "BLOCK_ELEMENTS", {"cuda": 2**12, "other": 2**12})
    rng = np.random.default_rng(6)
    gallery, bank = unit_rows(rng, 30, 8), unit_rows(rng, 5000, 8)
    want = hubless.make_correction("gc").fit(gallery, bank)
    peak, got = largest_allocation(lambda: hubless.make_correction("gc").fit(gallery, bank, device="cpu"))
    assert peak <= 3 * 4 * 2**12
    np.testing.assert_allclose(got.probes_, want.probes_, atol=1e-6)


def test_gc_fitted_on_scores_never_puts_the_whole_gallery_x_bank_on_the_device():
    """The score-matrix fit gathered every probe (n_gallery x n_bank) on the device (183x the
    budget here); now the probes gather on the host from the rows read there and are sorted on
    the device in chunks of one budget, and the blocks read are at most one budget."""
    rng = np.random.default_rng(7)
    gallery, bank = unit_rows(rng, 300, 16), unit_rows(rng, 2000, 16)
    sb = bank @ gallery.T
    want = hubless.make_correction("gc").fit_scores(sb)

    def on_device():
        with use_device("cpu"):
            return hubless.make_correction("gc").fit_scores(sb)

    peak, got = largest_allocation(on_device)
    assert peak <= BOUND, f"{peak / (4 * BUDGET):.1f}x the block budget"
    np.testing.assert_array_equal(got.probes_, want.probes_)


# ---------------------------------------------------------------------- one upload per input
@pytest.fixture
def real_copies(monkeypatch):
    """Every upload a real copy (as on a GPU; CPU torch otherwise shares a float32 array's
    memory); the uploads of (n, d) arrays counted by shape."""
    uploads: list[tuple[int, ...]] = []

    def copying(array):
        if array.ndim == 2:
            uploads.append(tuple(array.shape))
        return torch.from_numpy(np.array(array, copy=True))

    monkeypatch.setattr(ta, "from_numpy", copying)
    return uploads


@pytest.mark.parametrize("source", ["float32", "float64"])
def test_rows_normalised_by_the_check_are_uploaded_once(source, real_copies):
    """Inputs that are not unit length used to be uploaded twice (the raw rows for the check,
    the normalised rows for the passes) and both copies stayed on the device: the check's
    upload is now normalised on the device, bitwise as the host normalises, and serves the
    passes; the caller's array is never written."""
    from hubless._validation import as_embeddings
    from hubless.engine.device import checked_on_device

    rng = np.random.default_rng(8)
    raw = (unit_rows(rng, 300, 16).astype(source) * rng.uniform(0.5, 3.0, (300, 1))).astype(source)
    raw[:5] /= np.linalg.norm(raw[:5], axis=1, keepdims=True)  # rows already unit: left as they are
    before = raw.copy()
    want = as_embeddings(raw, "gallery", normalize=True)
    with use_device("cpu"), checked_on_device():
        checked = as_embeddings(raw, "gallery", normalize=True)
        scope = ta._SCOPE.get()
        assert [ref() is checked for ref, _ in scope.values()] == [True]  # one copy, of the normalised rows
        assert ta.put(checked, "cpu", "float32") is next(iter(scope.values()))[1]
        np.testing.assert_array_equal(ta.to_host(ta.put(checked, "cpu", "float32")), want)
    np.testing.assert_array_equal(checked, want)
    np.testing.assert_array_equal(raw, before)
    assert real_copies == [(300, 16)]


def test_a_fit_on_the_device_uploads_each_input_once(real_copies):
    rng = np.random.default_rng(9)
    gallery, bank = (unit_rows(rng, n, 16) * 2.5 for n in (200, 700))
    want = hubless.make_correction("nnn:k=5").fit(gallery, bank)
    got = hubless.make_correction("nnn:k=5").fit(gallery, bank, device="cpu")
    assert sorted(real_copies) == [(200, 16), (700, 16)]
    np.testing.assert_allclose(got.bias_, want.bias_, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.gallery_, want.gallery_)


# ---------------------------------------------------------------------- a device copy never stale
@pytest.fixture
def half(monkeypatch):
    """bfloat16 products: CPU torch makes a real copy of each array (a float32 upload would be
    the host memory itself, which cannot go stale), so a kept copy is exercised as on a GPU."""
    monkeypatch.setattr(ta, "_KEPT", type(ta._KEPT)())
    with use_device("cpu", "bfloat16"):
        yield


def _changed_in_place(gallery: np.ndarray) -> None:
    gallery[:] = gallery[::-1].copy()  # every item moves: a stale copy ranks other ids


def test_a_writeable_gallery_changed_in_place_is_seen_by_the_next_search(half):
    """The device copy of a gallery was kept by the array object: an array changed in place
    served the old rows. A writeable array is now uploaded once per call (nothing kept), so the
    next search ranks the new rows, as a fresh upload does."""
    rng = np.random.default_rng(10)
    gallery, bank, queries = unit_rows(rng, 150, 16), unit_rows(rng, 300, 16), unit_rows(rng, 20, 16)
    corr = hubless.make_correction("nnn:k=5").fit(gallery, bank)
    assert corr.gallery_ is gallery and gallery.flags.writeable  # the caller's array, untouched
    first = corr.search(queries, 5)[1]
    assert not any(ref() is gallery for ref, _ in ta._KEPT.values())
    _changed_in_place(gallery)
    after = corr.search(queries, 5)[1]
    ta._KEPT.clear()
    fresh = corr.search(queries, 5)[1]
    np.testing.assert_array_equal(after, fresh)
    assert (after != first).any()


def test_evaluate_sees_a_gallery_changed_in_place_between_calls(half):
    rng = np.random.default_rng(11)
    gallery, bank, queries = unit_rows(rng, 150, 16), unit_rows(rng, 300, 16), unit_rows(rng, 40, 16)
    truth = np.arange(len(queries))
    runs = [hubless.evaluate(gallery, queries, truth, bank, ["nnn:k=5"], bootstrap=0, progress=False)]
    _changed_in_place(gallery)
    runs.append(hubless.evaluate(gallery, queries, truth, bank, ["nnn:k=5"], bootstrap=0, progress=False))
    ta._KEPT.clear()
    fresh = hubless.evaluate(gallery.copy(), queries, truth, bank, ["nnn:k=5"], bootstrap=0, progress=False)
    assert [r.metrics for r in runs[1].results] == [r.metrics for r in fresh.results]
    assert [r.metrics for r in runs[1].results] != [r.metrics for r in runs[0].results]


def test_a_read_only_gallery_and_the_biases_stay_on_the_device_until_made_writeable(half):
    """What nobody can change in place stays on the device between calls: a read-only gallery,
    a correction's own copy of a gallery it normalised, its biases. Made writeable again, an
    array loses its copy at its next use, so a change made then is seen."""
    rng = np.random.default_rng(12)
    gallery, bank, queries = unit_rows(rng, 150, 16), unit_rows(rng, 300, 16), unit_rows(rng, 20, 16)
    gallery.flags.writeable = False
    corr = hubless.make_correction("nnn:k=5").fit(gallery, bank)
    corr.search(queries, 5)
    kept = {id(ref()): tensor for ref, tensor in ta._KEPT.values()}
    assert id(gallery) in kept and id(corr.bias_columns_) in kept and not corr.bias_columns_.flags.writeable
    corr.search(queries, 5)
    assert ta.put(gallery, "cpu", "bfloat16", keep=True) is kept[id(gallery)]  # the same copy, no upload
    gallery.flags.writeable = True
    _changed_in_place(gallery)
    after = corr.search(queries, 5)[1]
    assert not any(ref() is gallery for ref, _ in ta._KEPT.values())
    ta._KEPT.clear()
    np.testing.assert_array_equal(after, corr.search(queries, 5)[1])
    scaled = unit_rows(rng, 150, 16) * 2.0  # normalised by the fit: the correction's own copy
    own = hubless.make_correction("nnn:k=5").fit(scaled, bank)
    assert not own.gallery_.flags.writeable and scaled.flags.writeable
    own.search(queries, 5)
    assert any(ref() is own.gallery_ for ref, _ in ta._KEPT.values())


def test_an_array_viewing_writeable_memory_is_not_kept():
    base = np.zeros((10, 4), np.float32)
    view = base[2:8]
    view.flags.writeable = False
    assert not ta.unchangeable(view)  # base can still change it
    base.flags.writeable = False
    assert ta.unchangeable(view)
    assert ta.unchangeable(np.frombuffer(bytes(64), np.float32).reshape(4, 4))
    assert not ta.unchangeable(np.frombuffer(bytearray(64), np.float32).reshape(4, 4))
