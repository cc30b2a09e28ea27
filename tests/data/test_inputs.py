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


def test_an_embed_meta_json_gives_items_without_their_place_in_the_embedded_list(tmp_path):
    """The ``index`` of an ``OUT.meta.json`` item is its place in the list that was embedded: as
    an index's metadata it sat beside the item's id and disagreed with it (items added later, or
    built with --ids). Item metadata read from such a file leaves it out; a table of the user's
    own with an ``index`` column keeps it."""
    import json

    from typer.testing import CliRunner

    import hubless
    from hubless.cli.main import app
    from hubless.inputs import read_records

    pytest.importorskip("pyarrow")
    rng = np.random.default_rng(5)
    gallery, new, bank = (rng.standard_normal((n, 8)).astype(np.float32) for n in (20, 3, 60))
    for name, array in (("g", gallery), ("new", new), ("b", bank)):
        np.save(tmp_path / f"{name}.npy", array)

    def embed_meta(name: str, n: int) -> None:
        items = [{"index": i, "text": f"{name} {i}"} for i in range(n)]
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"model": "m", "dim": 8, "items": items}))

    embed_meta("g", 20)
    embed_meta("new", 3)
    assert read_records(tmp_path / "g.meta.json")[4] == {"text": "g 4"}
    (tmp_path / "mine.json").write_text(json.dumps([{"index": 7, "text": "mine"}]))
    assert read_records(tmp_path / "mine.json") == [{"index": 7, "text": "mine"}]

    runner = CliRunner()
    ids = ",".join(str(100 + i) for i in range(20))
    build = ["index", "build", "--gallery", str(tmp_path / "g.npy"), "--query-bank", str(tmp_path / "b.npy"), "--ids", ids,
             "--metadata", str(tmp_path / "g.meta.json"), "--out", str(tmp_path / "idx")]  # fmt: skip
    assert runner.invoke(app, build).exit_code == 0
    add = ["index", "add", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "new.npy"), "--metadata", str(tmp_path / "new.meta.json")]
    result = runner.invoke(app, add)
    assert result.exit_code == 0, result.output
    index = hubless.Index.load(tmp_path / "idx")
    items = index.get(index.ids)
    records = items.metadata.to_pylist() if hasattr(items.metadata, "to_pylist") else list(items.metadata)
    assert all("index" not in r for r in records)
    assert [r["text"] for r in records] == [f"g {i}" for i in range(20)] + [f"new {i}" for i in range(3)]
    assert index.ids[:20].tolist() == list(range(100, 120))
