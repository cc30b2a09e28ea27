"""One validation for in-memory arrays and sharded sources (issue 33): every bad input below is
refused with the same error class by a single-machine fit and by the distributed fit on a real
local Ray, a bad row named by its row in the whole set (and, on Ray, its row in its shard and the
shard's file), and what can be checked from headers and arguments is refused before any
distributed work starts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hubless.distributed as hd
from hubless.corrections import make_correction
from hubless.errors import HublessError, InvalidInput, InvalidType, MissingInput
from hubless.index import Index
from tests.conftest import unit_rows

N_GALLERY, N_BANK, DIM, CUT = 1500, 2000, 8, 1000


def _base(seed: int = 3):
    rng = np.random.default_rng(seed)
    return unit_rows(rng, N_GALLERY, DIM), unit_rows(rng, N_BANK, DIM)


def _with(x, row, value):
    x = x.copy()
    x[row] = value
    return x


# name -> (gallery, query_bank, spec, normalize, the error class, text both messages hold)
def _cases():
    g, b = _base()
    return {
        "int32 gallery": (g.astype(np.int32), b, "nnn:k=5", True, InvalidType, "floating-point"),
        "int64 bank": (g, (b * 100).astype(np.int64), "nnn:k=5", True, InvalidType, "floating-point"),
        "bool gallery": (g > 0, b, "nnn:k=5", True, InvalidType, "floating-point"),
        "complex bank": (g, b.astype(np.complex64), "nnn:k=5", True, InvalidType, "floating-point"),
        "strings (parquet column of strings)": (np.full((N_GALLERY, 1), "a photo of a cat"), b, "nnn:k=5", True, InvalidType, ""),
        "NaN in a gallery row": (_with(g, 1017, np.nan), b, "nnn:k=5", True, InvalidInput, "row 1017"),
        "inf in a bank row": (g, _with(b, 1999, np.inf), "is:beta=20.0", True, InvalidInput, "row 1999"),
        "all-zero gallery row (normalize)": (_with(g, 1203, 0.0), b, "dis:k_activation=2", True, InvalidInput, "row 1203"),
        "all-zero bank row (normalize)": (g, _with(b, 5, 0.0), "nnn:k=5", True, InvalidInput, "row 5"),
        "overflowing norm (no normalize)": (_with(g, 1499, 1e17), b, "nnn:k=5", False, InvalidInput, "row 1499"),
        "empty gallery": (g[:0], b, "nnn:k=5", True, InvalidInput, "empty"),
        "1-D gallery": (g[0], b, "nnn:k=5", True, InvalidInput, "2-D"),
        "zero-length vectors": (g[:, :0], b[:, :0], "nnn:k=5", True, InvalidInput, "zero-length"),
        "bank of another dimension": (g, b[:, :6], "nnn:k=5", True, InvalidInput, "dimension"),
        "k larger than the bank": (g, b[:40], "nnn:k=50", True, InvalidInput, "k=50"),
        "missing query bank": (g, None, "nnn:k=5", True, MissingInput, "query bank"),
    }


CASES = _cases()


def _write(folder, x):
    """An array as shards: .npy cut at row CUT (one file when it cannot be cut), or parquet for strings."""
    folder.mkdir()
    if x.dtype.kind == "U":
        pq.write_table(pa.table({"embedding": pa.array(x[:, 0])}), folder / "part_0.parquet")
        return folder
    pieces = [x[:CUT], x[CUT:]] if x.ndim == 2 and len(x) > CUT else [x]
    for i, piece in enumerate(pieces):
        np.save(folder / f"part_{i}.npy", piece)
    return folder


def _in_process(gallery, bank, spec, normalize):
    make_correction(spec).set_params(normalize=normalize).fit(gallery, bank)


def _on_ray(gallery, bank, spec, normalize, tmp_path, **options):
    g = _write(tmp_path / "g", gallery)
    b = None if bank is None else _write(tmp_path / "b", bank)
    hd.fit(make_correction(spec).set_params(normalize=normalize), g, b, gallery_rows=512, bank_cols=700, progress=False, **options)


@pytest.mark.filterwarnings("ignore::hubless.UnnormalizedEmbeddingsWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_gives_the_same_error_in_process_and_on_ray(ray_local, tmp_path, name):
    gallery, bank, spec, normalize, kind, text = CASES[name]
    with pytest.raises(HublessError) as local:
        _in_process(gallery, bank, spec, normalize)
    with pytest.raises(HublessError) as distributed:
        _on_ray(gallery, bank, spec, normalize, tmp_path)
    assert type(local.value) is kind, local.value
    assert type(distributed.value) is kind, distributed.value
    assert text in str(local.value) and text in str(distributed.value), (str(local.value), str(distributed.value))
    if "row " in text:  # a bad row: its row in the whole set, its row in its shard, the shard
        row = int(text.split()[1])
        shard, in_shard = ("part_0.npy", row) if row < CUT else ("part_1.npy", row - CUT)
        assert f"row {in_shard} of shard " in str(distributed.value) and shard in str(distributed.value), distributed.value


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_shards_are_accepted_as_arrays_are(ray_local, tmp_path, dtype):
    g, b = _base(5)
    want = make_correction("nnn:k=5").fit(g.astype(dtype), b.astype(dtype))
    _write(tmp_path / "g", g.astype(dtype))
    _write(tmp_path / "b", b.astype(dtype))
    got = hd.fit("nnn:k=5", tmp_path / "g", tmp_path / "b", gallery_rows=512, bank_cols=700, progress=False)
    np.testing.assert_allclose(got.bias_columns_, want.bias_columns_, rtol=1e-6, atol=1e-6)


def test_header_and_argument_errors_come_before_any_distributed_work(tmp_path):
    """Without Ray running (not even imported by these checks): headers, sizes, metadata and the
    factory are checked first, so nothing waits for a fit to be refused."""
    g, b = _base()
    gdir, bdir = _write(tmp_path / "g", g), _write(tmp_path / "b", b)
    work = tmp_path / "work"
    with pytest.raises(InvalidInput, match=r"metadata must be 1500 records"):
        hd.build_index("nnn:k=5", gdir, bdir, "Flat", metadata=[{"i": i} for i in range(1499)], work_dir=work, progress=False)
    with pytest.raises(InvalidInput, match="unsupported FAISS factory"):
        hd.build_index("nnn:k=5", gdir, bdir, "IVF,,Flat", work_dir=work, progress=False)
    with pytest.raises(InvalidInput, match="HNSW graph cannot be merged"):
        hd.build_index("nnn:k=5", gdir, bdir, "HNSW32", work_dir=work, progress=False)
    with pytest.raises(InvalidInput, match="k=5000"):
        hd.write_augmented("nnn:k=5000", gdir, bdir, out=tmp_path / "out", work_dir=work, progress=False)
    np.save(bdir / "part_1.npy", b[CUT:].astype(np.int32))
    with pytest.raises(InvalidType, match=r"query_bank shard .*part_1.npy must be a floating-point array"):
        hd.fit("nnn:k=5", gdir, bdir, work_dir=work, progress=False)
    assert not work.exists()  # no tile planned, no work dir made


def test_the_metadata_of_a_distributed_build_is_checked_as_index_build_checks_it(tmp_path):
    g, b = _base()
    bad = [{"i": i} for i in range(N_GALLERY - 1)]
    with pytest.raises(InvalidInput) as local:
        Index.build(g, b, "nnn:k=5", "Flat", metadata=bad)
    with pytest.raises(InvalidInput) as distributed:
        hd.build_index("nnn:k=5", _write(tmp_path / "g", g), _write(tmp_path / "b", b), "Flat", metadata=bad, progress=False)
    assert str(local.value) == str(distributed.value)


@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_shards_are_normalised_as_arrays_are_and_left_untouched(tmp_path, kind):
    from hubless._validation import as_embeddings
    from hubless.storage.sources import open_source

    x = np.random.default_rng(0).standard_normal((300, 6)).astype(np.float32) * 3
    if kind == "npy":
        np.save(tmp_path / "a.npy", x[:120])
        np.save(tmp_path / "b.npy", x[120:])
    else:
        for name, piece in (("a", x[:120]), ("b", x[120:])):
            col = pa.FixedSizeListArray.from_arrays(pa.array(piece.ravel()), 6)
            pq.write_table(pa.table({"embedding": col}), tmp_path / f"{name}.parquet", row_group_size=50)
    src = open_source(tmp_path)
    want = as_embeddings(x, "gallery", normalize=True)
    for lo, hi in [(0, 300), (100, 130), (120, 121), (7, 119)]:
        np.testing.assert_array_equal(src.read(lo, hi, normalize=True), want[lo:hi])
        np.testing.assert_array_equal(src.read(lo, hi), x[lo:hi])  # the files were not written into
