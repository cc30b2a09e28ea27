"""A live index against a plain dict model: after any sequence of adds, removes, upserts,
compactions, saves, loads and re-opens, searching it (with and without a metadata filter)
equals brute force over the model's items (a fresh fit of the correction on them, in the same
order, with the same ids), DIS/DualDIS activation sets included; exact and FAISS indexes (Flat,
IVF, HNSW, IVF-PQ), plain and memory-mapped handles, a stale handle's save (a Conflict), writes
through the CLI, files damaged between steps (refused by name, never carried into a new base)
and ids up to int64's limit (issue 38)."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.corrections import make_correction
from hubless.errors import AlreadyExists, Conflict, Corrupt, InvalidInput, NotFound
from hubless.index import integrity, pointer
from hubless.index.ids import MAX_ID
from tests.conftest import unit_rows

DIM = 8
RNG = np.random.default_rng(99)
BANK = unit_rows(RNG, 60, DIM)
GALLERY_BANK = unit_rows(RNG, 40, DIM)
QUERIES = unit_rows(RNG, 12, DIM)


def brute_force(spec: str, model: dict, queries: np.ndarray, k: int, where=None):
    """The reference: the correction fitted from scratch on the model's items (in order), its
    exact scores for every item, the items not matching ``where`` left out, best first (ties to
    the earlier item): (scores, ids) padded with -inf / -1."""
    ids = np.array(list(model), dtype=np.int64)
    gallery = np.stack([model[i][0] for i in ids])
    corr = make_correction(spec).fit(gallery, BANK, GALLERY_BANK)
    scores = corr.score(queries).astype(np.float64)
    if where is not None:
        ((key, value),) = where.items()
        keep = np.array([model[i][1].get(key) == value for i in ids])
        scores[:, ~keep] = -np.inf
    order = np.lexsort((np.broadcast_to(np.arange(len(ids)), scores.shape), -scores), axis=1)[:, :k]
    top = np.take_along_axis(scores, order, axis=1)
    out_ids = np.where(np.isfinite(top), ids[order], -1)
    if top.shape[1] < k:
        pad = k - top.shape[1]
        top = np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf)
        out_ids = np.pad(out_ids, ((0, 0), (0, pad)), constant_values=-1)
    return top, out_ids, corr


def assert_same_results(scores, ids, ref_scores, ref_ids):
    """Same ids and scores; two items may swap only where their scores tie within rounding."""
    finite = np.isfinite(ref_scores)
    np.testing.assert_array_equal(np.isfinite(scores), finite)
    np.testing.assert_allclose(scores[finite], ref_scores[finite], rtol=2e-5, atol=2e-6)
    for q, r in zip(*np.nonzero(ids != ref_ids)):
        tied = np.isclose(ref_scores[q], ref_scores[q, r], rtol=2e-5, atol=2e-6)
        assert ids[q, r] in ref_ids[q][tied], (q, r, ids[q], ref_ids[q])


class LiveIndexMachine(RuleBasedStateMachine):
    """One index (in memory, or opened live on a directory) and the dict model id -> (row, meta)."""

    spec = "nnn:alpha=0.5,k=4"
    factory = "Flat"
    extra_items = 0  # items the first build adds (PQ trains on hundreds)

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="hubless-live-"))
        self.path = self.folder / "idx"
        self.model: dict[int, tuple[np.ndarray, dict]] = {}
        self.next_id = 0
        self.huge = 0  # ids given from the top of the int64 range so far
        self.rng = np.random.default_rng(0)

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def rows(self, n: int) -> np.ndarray:
        return unit_rows(self.rng, n, DIM)

    def records(self, n: int) -> list[dict]:
        return [{"g": int(self.rng.integers(0, 3))} for _ in range(n)]

    @initialize(seed=st.integers(0, 2**16), n=st.integers(6, 20), live=st.booleans())
    def build(self, seed, n, live):
        self.rng = np.random.default_rng(seed)
        n += self.extra_items
        rows, meta = self.rows(n), self.records(n)
        # every list probed and every item a candidate: exact, so any difference is the live index's
        # (published DualDIS takes its IVF candidates from the bias form: an approximation of its own)
        index = hubless.Index.build(rows, BANK, self.spec, self.factory, gallery_bank=GALLERY_BANK, metadata=meta, nprobe=4,
                                    rescore_factor=50 + 2 * self.extra_items)  # fmt: skip
        self.model = {i: (rows[i], meta[i]) for i in range(n)}
        self.next_id = n
        index.save(self.path)
        self.index = hubless.Index.open(self.path) if live else index

    @rule(n=st.integers(1, 4), explicit=st.sampled_from(["assigned", "keys", "huge"]))
    def add(self, n, explicit):
        rows, meta = self.rows(n), self.records(n)
        ids = None
        if explicit == "keys" and self.next_id + 100 + 3 * n <= MAX_ID:
            ids = self.next_id + 100 + np.arange(n) * 3  # a user's own keys, not in order of the counter
        elif explicit == "huge":  # from the top of the int64 range down: the largest id first
            ids = MAX_ID - self.huge - np.arange(n)
            self.huge += n
            if (ids < 0).any() or any(int(i) in self.model for i in ids):
                return
        elif self.next_id + n - 1 > MAX_ID:  # no id left to assign: refused, naming the limit
            with pytest.raises(InvalidInput, match=r"2\*\*63 - 2"):
                self.index.add(rows, meta)
            return
        got = self.index.add(rows, meta, ids=ids)
        expected = np.arange(self.next_id, self.next_id + n) if ids is None else ids
        np.testing.assert_array_equal(got, expected)
        for i, row, m in zip(expected.tolist(), rows, meta):
            self.model[i] = (row, m)
        self.next_id = max(self.next_id, int(expected.max()) + 1)

    @precondition(lambda self: len(self.model) > 5)
    @rule(data=st.data())
    def remove(self, data):
        present = sorted(self.model)
        chosen = data.draw(st.lists(st.sampled_from(present), min_size=1, max_size=min(3, len(present) - 5), unique=True))
        np.testing.assert_array_equal(self.index.remove(chosen), sorted(chosen))
        for i in chosen:
            del self.model[i]

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), new=st.integers(0, 2))
    def upsert(self, data, new):
        present = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=2, unique=True))
        spare = [i for i in range(10**6, 10**6 + 50) if i not in self.model]  # ids not present (below any huge id)
        ids = present + spare[:new]
        rows, meta = self.rows(len(ids)), self.records(len(ids))
        self.index.upsert(ids, rows, meta)
        for i, row, m in zip(ids, rows, meta):
            self.model.pop(i, None)
            self.model[i] = (row, m)  # an upserted item moves to the end, as it is written last
        self.next_id = max(self.next_id, max(ids) + 1)

    @rule()
    def refused_writes_change_nothing(self):
        before = self.index.ids.copy()
        some = next(iter(self.model))
        with pytest.raises(AlreadyExists, match=str(some)):
            self.index.add(self.rows(2), ids=[10**9, some])
        with pytest.raises(NotFound, match="no item with id 999999999"):
            self.index.remove([some, 999_999_999])
        with pytest.raises(InvalidInput, match="'g' holds int64"):
            self.index.add(self.rows(1), [{"g": "text"}], ids=[10**9 + 7])
        np.testing.assert_array_equal(self.index.ids, before)

    @rule()
    def compact(self):
        self.index.compact()

    @rule()
    def save_and_load(self):
        self.index.save(self.path, overwrite=True)
        self.index = hubless.Index.load(self.path, mmap=bool(self.rng.integers(2)))

    @rule(mmap=st.booleans())
    def reopen(self, mmap):
        if self.index._path is None or not self.index._live:
            self.index.save(self.path, overwrite=True)
        self.index = hubless.Index.open(self.path, mmap=mmap)

    def _live_on_disk(self) -> bool:
        return bool(self.index._live and self.index._path is not None)

    @precondition(lambda self: self._live_on_disk())
    @rule(mmap=st.booleans())
    def stale_handle_save_is_a_conflict(self, mmap):
        stale = hubless.Index.load(self.path, mmap=mmap)
        row, meta = self.rows(1), self.records(1)
        other = hubless.Index.open(self.path, mmap=not mmap)  # another writer commits meanwhile
        if other._snap.next_id > MAX_ID:
            return
        (written,) = other.add(row, meta).tolist()
        self.model[written] = (row[0], meta[0])
        self.next_id = max(self.next_id, written + 1)
        stale.add(self.rows(1), self.records(1))
        with pytest.raises(Conflict, match="changed since this index was loaded"):
            stale.save(self.path, overwrite=True)
        self.index.refresh()

    @precondition(lambda self: self._live_on_disk() and self.next_id + 2 <= MAX_ID)
    @rule(n=st.integers(1, 2))
    def cli_add(self, n):
        rows, meta = self.rows(n), self.records(n)
        np.save(self.folder / "new.npy", rows)
        (self.folder / "new.json").write_text(json.dumps(meta))
        result = CliRunner().invoke(app, ["index", "add", str(self.path), "--embeddings", str(self.folder / "new.npy"),
                                          "--metadata", str(self.folder / "new.json"), "--no-progress"])  # fmt: skip
        assert result.exit_code == 0, result.output
        ids = [int(i) for i in result.output.split("ids ")[1].split("\n")[0].split(", ")]
        for i, row, m in zip(ids, rows, meta):
            self.model[i] = (row, m)
        self.next_id = max(self.next_id, max(ids) + 1)
        self.index.refresh()

    @precondition(lambda self: self._live_on_disk() and len(self.model) > 5)
    @rule(data=st.data())
    def cli_remove(self, data):
        chosen = data.draw(st.sampled_from(sorted(self.model)))
        result = CliRunner().invoke(app, ["index", "remove", str(self.path), "--ids", str(chosen)])
        assert result.exit_code == 0, result.output
        del self.model[chosen]
        self.index.refresh()

    @precondition(lambda self: self._live_on_disk())
    @rule()
    def cli_compact(self):
        result = CliRunner().invoke(app, ["index", "compact", str(self.path)])
        assert result.exit_code == 0, result.output
        self.index.refresh()

    @precondition(lambda self: self._live_on_disk())
    @rule(data=st.data())
    def damaged_file_is_refused_then_repaired(self, data):
        """A base file damaged between steps: verify names it, a mapped handle's compaction and
        the CLI's compaction refuse it (nothing written); the file is then repaired."""
        manifest, _ = pointer.read_manifest(self.path)
        base = manifest["base"]
        mapped = sorted(n for n in base["files"] if n == "gallery.npy" or n.startswith("stat.") or n == "index.faiss")
        name = data.draw(st.sampled_from(mapped))
        file = self.path / base["name"] / name
        good = file.read_bytes()
        raw = bytearray(good)
        raw[-4] ^= 0x21
        file.write_bytes(bytes(raw))
        try:
            with pytest.raises(Corrupt, match=name):
                integrity.verify(self.path)
            with pytest.raises(Corrupt, match=name):
                hubless.Index.open(self.path, mmap=True).compact()
            with pytest.raises(Corrupt, match=name):
                hubless.Index.load(self.path, mmap=True).save(self.folder / "copy")
            assert pointer.read_manifest(self.path)[0]["base"]["name"] == base["name"]  # no new base
        finally:
            file.write_bytes(good)
            shutil.rmtree(self.folder / "copy", ignore_errors=True)

    @invariant()
    def searches_equal_brute_force(self):
        index, model = self.index, self.model
        assert index.ntotal == len(model)
        np.testing.assert_array_equal(index.ids, list(model))
        k = min(5, len(model))
        ref_scores, ref_ids, corr = brute_force(self.spec, model, QUERIES, k)
        scores, ids = index.search(QUERIES, k)
        assert_same_results(scores, ids, ref_scores, ref_ids)
        for mask in ("activation_mask_", "activation_masks_"):
            if hasattr(corr, mask):
                np.testing.assert_array_equal(getattr(index.correction, mask), getattr(corr, mask))
        where = {"g": 1}
        ref_scores, ref_ids, _ = brute_force(self.spec, model, QUERIES, 4, where)
        scores, ids = index.search(QUERIES, 4, where=where)
        assert_same_results(scores, ids, ref_scores, ref_ids)
        some = list(model)[:: max(1, len(model) // 3)]
        items = index.get(some)
        np.testing.assert_allclose(items.embeddings, np.stack([model[i][0] for i in some]), atol=1e-6)
        assert items.metadata == [model[i][1] for i in some]

    @invariant()
    def the_saved_index_is_what_a_live_index_committed(self):
        if getattr(self.index, "_live", False) and self.index._path is not None:
            loaded = hubless.Index.load(self.path)
            np.testing.assert_array_equal(loaded.ids, self.index.ids)


def machine(spec: str, factory: str):
    return type(f"Live_{spec.split(':')[0]}_{factory.split(',')[0]}", (LiveIndexMachine,), {"spec": spec, "factory": factory})


SETTINGS = settings(max_examples=12, stateful_step_count=10, deadline=None, suppress_health_check=list(HealthCheck))
#: the factories added for issue 38 (HNSW, IVF-PQ: several hundred items to train): fewer examples
SETTINGS_FEW = settings(max_examples=5, stateful_step_count=10, deadline=None, suppress_health_check=list(HealthCheck))

TestLiveNNNFlat = machine("nnn:alpha=0.5,k=4", "Flat").TestCase
TestLiveNNNFlat.settings = SETTINGS
TestLiveDISFlat = machine("dis:beta=20.0,k_activation=2", "Flat").TestCase
TestLiveDISFlat.settings = SETTINGS
TestLiveDISIVF = machine("dis:beta=20.0,k_activation=1", "IVF4,Flat").TestCase
TestLiveDISIVF.settings = SETTINGS
TestLiveDualDISIVF = machine("dualdis:k_activation=1", "IVF4,Flat").TestCase
TestLiveDualDISIVF.settings = SETTINGS
TestLiveDNIVF = machine("dn:lam=0.5", "IVF4,Flat").TestCase
TestLiveDNIVF.settings = SETTINGS
TestLiveCSLSFlat = machine("csls:k=3", "Flat").TestCase
TestLiveCSLSFlat.settings = SETTINGS
TestLiveNNNHNSW = pytest.mark.slow(machine("nnn:alpha=0.5,k=4", "HNSW8").TestCase)
TestLiveNNNHNSW.settings = SETTINGS_FEW
_PQ = machine("nnn:alpha=0.5,k=4", "IVF2,PQ2x4")
_PQ.extra_items = 640  # 16 centroids per PQ part need 624 training items
TestLiveNNNIVFPQ = pytest.mark.slow(_PQ.TestCase)
TestLiveNNNIVFPQ.settings = SETTINGS_FEW


def test_threads_writing_one_index_each_get_their_own_ids(tmp_path):
    rng = np.random.default_rng(5)
    hubless.Index.build(unit_rows(rng, 50, DIM), BANK, "dis:k_activation=1", "Flat", metadata=[{"who": "init"}] * 50).save(tmp_path / "idx")
    index = hubless.Index.open(tmp_path / "idx")
    got: dict[str, list] = {}
    rows = {t: unit_rows(np.random.default_rng(t), 25, DIM) for t in range(4)}

    def writer(t):
        got[t] = [int(index.add(rows[t][j : j + 1], [{"who": f"{t}-{j}"}])[0]) for j in range(25)]

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(i for ids in got.values() for i in ids)
    assert every == list(range(50, 150))
    saved = hubless.Index.load(tmp_path / "idx")
    for t, ids in got.items():  # each id names the row its writer sent, with its metadata
        assert saved.records(ids) == [{"who": f"{t}-{j}"} for j in range(25)]
        np.testing.assert_allclose(saved.get(ids).embeddings, rows[t], atol=1e-6)
    ref = make_correction("dis:k_activation=1").fit(saved.correction.gallery_, BANK)
    np.testing.assert_array_equal(saved.correction.activation_mask_, ref.activation_mask_)


def test_a_server_notices_versions_written_elsewhere(tmp_path):
    rng = np.random.default_rng(6)
    hubless.Index.build(unit_rows(rng, 40, DIM), BANK, "nnn:k=4", "Flat").save(tmp_path / "idx")
    reader = hubless.Index.load(tmp_path / "idx")
    assert reader.refresh() is False  # nothing new: one stat of CURRENT
    writer = hubless.Index.open(tmp_path / "idx")
    new = writer.add(unit_rows(rng, 3, DIM))
    writer.remove([0])
    assert reader.refresh() is True
    np.testing.assert_array_equal(reader.ids, writer.ids)
    assert new[0] in reader and 0 not in reader
    writer.compact()
    writer.add(unit_rows(rng, 1, DIM))
    assert reader.refresh() is True  # a new base: loaded anew
    np.testing.assert_array_equal(reader.search(QUERIES, 5)[1], writer.search(QUERIES, 5)[1])


def test_ids_are_never_reused_and_user_ids_are_kept(tmp_path):
    rng = np.random.default_rng(7)
    index = hubless.Index.build(unit_rows(rng, 10, DIM), BANK, "nnn:k=4", "Flat", ids=[5, 9, 1000, 2, 3, 4, 6, 7, 8, 11])
    assert index.info()["next_id"] == 1001
    assert index.add(unit_rows(rng, 2, DIM)).tolist() == [1001, 1002]
    index.remove([1002, 1000])
    assert index.add(unit_rows(rng, 1, DIM)).tolist() == [1003]  # the removed 1002 is not given again
    assert index.add(unit_rows(rng, 1, DIM), ids=[1000]).tolist() == [1000]  # a user may re-add a key
    index.save(tmp_path / "idx")
    assert hubless.Index.open(tmp_path / "idx").add(unit_rows(rng, 1, DIM)).tolist() == [1004]
    with pytest.raises(InvalidInput, match=">= 0"):
        index.add(unit_rows(rng, 1, DIM), ids=[-4])
    with pytest.raises(InvalidInput, match="repeat 7"):
        index.add(unit_rows(rng, 2, DIM), ids=[7, 7])
    with pytest.raises(InvalidInput, match="2 ids for 1 items"):
        index.add(unit_rows(rng, 1, DIM), ids=[70, 71])
    with pytest.raises(InvalidInput, match="cannot remove every item"):
        index.remove(index.ids)
