import numpy as np
import pytest

from hubless.inputs import load_array, load_embeddings


def test_npy_and_npz_round_trip(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float64)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "one.npz", emb=x)
    np.savez(tmp_path / "two.npz", a=x, b=x[:2])
    assert np.array_equal(load_array(tmp_path / "x.npy"), x)
    assert np.array_equal(load_array(tmp_path / "one.npz"), x)
    assert np.array_equal(load_array(f"{tmp_path / 'two.npz'}:b"), x[:2])
    with pytest.raises(ValueError, match="holds 2 arrays"):
        load_array(tmp_path / "two.npz")
    with pytest.raises(KeyError, match="no array 'c'"):
        load_array(tmp_path / "two.npz", "c")
    emb = load_embeddings(tmp_path / "x.npy", "gallery")
    assert emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-6)
    with pytest.raises(ValueError, match="dimension 3"):
        load_embeddings(tmp_path / "x.npy", "queries", dim=4)


def test_bad_files_give_clear_errors(tmp_path):
    x = np.ones((100, 8), np.float32)
    np.save(tmp_path / "x.npy", x)
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_array(tmp_path / "cut.npy")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_array(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError):
        load_array(tmp_path / "missing.npy")
    (tmp_path / "x.txt").write_text("1 2 3")
    with pytest.raises(ValueError, match="unsupported"):
        load_array(tmp_path / "x.txt")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="no pickles"):
        load_array(tmp_path / "obj.npy")
