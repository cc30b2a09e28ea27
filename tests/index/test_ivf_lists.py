"""An IVF structure filled shard by shard and merged by streaming (hubless.index.ivf_lists, what the
distributed build writes with, here without Ray): every inverted list holds the codes and ids a
single-machine build holds, in the same order."""

from __future__ import annotations

import numpy as np
import pytest

from hubless.index import Index
from hubless.index.ivf_lists import train_from_base, write_merged, write_shard_lists
from tests.conftest import ivf_lists, unit_rows


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IVF8,PQ4x4"])
def test_shard_lists_merged_by_streaming_equal_a_single_machine_build(factory, tmp_path):
    import faiss

    rng = np.random.default_rng(3)
    single = Index.build(unit_rows(rng, 1500, 16), unit_rows(rng, 800, 16), "nnn:k=8", factory)
    single.save(tmp_path / "idx")
    folder = tmp_path / "idx" / "b000001"  # its gallery.npy and bias.npy, as a distributed build's tasks write them
    empty, layout, _ = train_from_base(factory, folder, 100_000, 0, None)
    assert layout.spill_below == single.config.spill_below
    parts: dict[str, list] = {"primary": [], "spill": []}
    for a, b in [(0, 400), (400, 1100), (1100, 1500)]:
        for kind, files in write_shard_lists(empty, folder, a, b, layout, str(tmp_path / f"lists-{a}")).items():
            parts[kind].append(files)
    ordered = parts["primary"] + parts["spill"]  # every primary entry, then the spilled copies
    ntotal = sum(int(np.load(sizes).sum()) for _, sizes in ordered)
    entry = write_merged(tmp_path / "merged.faiss", faiss.deserialize_index(empty), ordered, ntotal)
    merged = faiss.read_index(str(tmp_path / "merged.faiss"))
    assert entry["bytes"] == (tmp_path / "merged.faiss").stat().st_size and merged.ntotal == single._snap.faiss.ntotal
    for (codes, ids), (want_codes, want_ids) in zip(ivf_lists(merged), ivf_lists(single._snap.faiss), strict=True):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(codes, want_codes)
