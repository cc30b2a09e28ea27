"""Corrupt and partial input files, generated (hypothesis): every loader a user's file goes through
(embeddings .npy/.npz, tables .parquet/.json/.csv/.txt, ids, ground truth, score matrices
.npy/.npz/.pkl, a saved index) either reads the file as it should or refuses it with a
:class:`hubless.errors.HublessError` naming the file; never another exception (a numpy, zip,
pickle, pyarrow or JSON error a user would have to decode), never a crash, and a refused file is
left as it was."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import hubless
from hubless.errors import HublessError
from hubless.inputs import load_array, load_embeddings, read_ids, read_items, read_records
from hubless.metrics.truth import load_truth
from hubless.score_matrices.files import load_scores

#: The fuzz's examples: the same every run and in every checkout (derandomize's seed depends
#: on the test file's path).
SEED = 20261127

N, D = 12, 4
NAMES = ["emb.npy", "emb.npz", "ids.npy", "ids.txt", "truth.json", "truth.npy", "meta.json", "meta.csv", "texts.txt",
         "scores.npy", "scores.npz", "scores.pkl", "meta.parquet"]  # fmt: skip


def _files(root: Path) -> dict[str, tuple[Path, object]]:
    """name -> (a valid file, the loader that reads it)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    made = {}
    np.save(root / "emb.npy", x)
    made["emb.npy"] = lambda p: load_embeddings(p, "gallery", dim=D)
    np.savez(root / "emb.npz", images=x, other=x[:2])
    made["emb.npz"] = lambda p: load_array(f"{p}:images")
    np.save(root / "ids.npy", np.arange(N, dtype=np.int64))
    made["ids.npy"] = lambda p: read_ids(str(p))
    (root / "ids.txt").write_text("\n".join(map(str, range(N))))
    made["ids.txt"] = lambda p: read_ids(str(p))
    (root / "truth.json").write_text(json.dumps([[i % N] for i in range(N)]))
    made["truth.json"] = lambda p: load_truth(str(p), N, N)
    np.save(root / "truth.npy", np.arange(N) % N)
    made["truth.npy"] = lambda p: load_truth(str(p), N, N)
    records = [{"caption": f"item {i}", "year": 2000 + i} for i in range(N)]
    (root / "meta.json").write_text(json.dumps(records))
    made["meta.json"] = read_records
    (root / "meta.csv").write_text("caption,year\n" + "\n".join(f"item {i},{2000 + i}" for i in range(N)))
    made["meta.csv"] = read_records
    (root / "texts.txt").write_text("\n".join(f"a photo of item {i}" for i in range(N)))
    made["texts.txt"] = read_items
    scores = rng.standard_normal((N, N)).astype(np.float32)
    np.save(root / "scores.npy", scores)
    made["scores.npy"] = lambda p: load_scores(p, n_cols=N)
    np.savez(root / "scores.npz", scores=scores)
    made["scores.npz"] = lambda p: load_scores(f"{p}:scores", n_cols=N)
    with open(root / "scores.pkl", "wb") as fh:
        pickle.dump(scores, fh)
    made["scores.pkl"] = lambda p: load_scores(p, n_cols=N)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), root / "meta.parquet")
        made["meta.parquet"] = read_records
    except ImportError:  # pyarrow is the [index] extra
        pass
    return {name: (root / name, load) for name, load in made.items()}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("valid")
    files = _files(root)
    for path, load in files.values():
        load(path)  # every original reads
    return files


damage = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 0.999)),  # the file cut at a fraction of its length
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 0.999), st.integers(1, 255)), min_size=1, max_size=4)),
    st.tuples(st.just("garbage"), st.binary(max_size=300)),
)


def damaged(data: bytes, how) -> bytes:
    kind, what = how
    if kind == "cut":
        return data[: int(len(data) * what)]
    if kind == "garbage":
        return what
    out = bytearray(data)
    for where, xor in what:
        out[int(len(out) * where)] ^= xor
    return bytes(out)


@seed(SEED)
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(NAMES), how=damage)
def test_a_damaged_input_file_is_read_or_refused_with_a_hubless_error(originals, tmp_path_factory, name, how):
    if name not in originals:
        return  # parquet without pyarrow
    path, load = originals[name]
    target = tmp_path_factory.mktemp("damaged") / name
    bad = damaged(path.read_bytes(), how)
    target.write_bytes(bad)
    try:
        load(target)
    except HublessError as exc:
        assert str(exc).strip(), "an error says what is wrong"
    assert target.read_bytes() == bad  # reading never changes the user's file


@pytest.fixture(scope="module")
def saved_index(tmp_path_factory):
    rng = np.random.default_rng(1)
    root = tmp_path_factory.mktemp("index")
    unit = lambda n: (lambda a: a / np.linalg.norm(a, axis=1, keepdims=True))(rng.standard_normal((n, D)).astype(np.float32))  # noqa: E731
    index = hubless.Index.build(unit(N), unit(20), "nnn:alpha=0.5,k=4", "Flat", metadata=[{"year": i} for i in range(N)])
    index.set_keep_versions(3).save(root / "idx")
    live = hubless.Index.open(root / "idx")  # written as a live index is: segments, deletions, kept versions
    live.add(unit(3), [{"year": 1} for _ in range(3)])
    live.remove(live.ids[:2])
    live.update_metadata(live.ids[:1], values={"year": 7})
    return root / "idx", sorted(p.relative_to(root / "idx") for p in (root / "idx").rglob("*") if p.is_file())


@seed(SEED)
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(pick=st.integers(0, 10**6), how=damage)
def test_a_damaged_index_file_is_loaded_or_refused_with_a_hubless_error(saved_index, tmp_path_factory, pick, how):
    source, files = saved_index
    folder = tmp_path_factory.mktemp("idx") / "idx"
    shutil.copytree(source, folder)
    victim = folder / files[pick % len(files)]
    victim.write_bytes(damaged(victim.read_bytes(), how))
    try:
        index = hubless.Index.load(folder)
        index.search(np.eye(D, dtype=np.float32)[:2], 3)
        for version in hubless.Index.versions(folder):
            hubless.Index.load(folder, version=version["version"]).search(np.eye(D, dtype=np.float32)[:1], 2)
    except HublessError as exc:
        assert str(exc).strip()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    """A sidecar of NNN attached to a FAISS file the user wrote (IndexIDMap2 with their ids)."""
    faiss = pytest.importorskip("faiss")
    from hubless.attached import attach

    rng = np.random.default_rng(2)
    unit = lambda n: (lambda a: a / np.linalg.norm(a, axis=1, keepdims=True))(rng.standard_normal((n, D)).astype(np.float32))  # noqa: E731
    root = tmp_path_factory.mktemp("attached")
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    index.add_with_ids(unit(N), np.arange(N, dtype=np.int64) * 7 + 3)
    faiss.write_index(index, str(root / "c.faiss"))
    attach(str(root / "c.faiss"), unit(20), "nnn:alpha=0.5,k=4", out=root / "side", progress=False)
    return root, sorted(p.relative_to(root) for p in (root / "side").rglob("*") if p.is_file()) + [Path("c.faiss")]


@seed(SEED)
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(pick=st.integers(0, 10**6), how=damage)
def test_a_damaged_sidecar_or_collection_file_is_refused_with_a_hubless_error(sidecar, tmp_path_factory, pick, how):
    from hubless.attached import AttachedCollection

    source, files = sidecar
    root = tmp_path_factory.mktemp("att")
    shutil.copytree(source, root, dirs_exist_ok=True)
    victim = root / files[pick % len(files)]
    victim.write_bytes(damaged(victim.read_bytes(), how))
    try:
        attached = AttachedCollection.open(str(root / "c.faiss"), root / "side")
        attached.search(np.eye(D, dtype=np.float32)[:2], 3)
    except HublessError as exc:
        assert str(exc).strip()


@pytest.mark.parametrize("pointer", [b"..", b"../side", b"/etc", b"v\x00x", b"", b"\xff\xfe", b"sub/dir", b"v\n2"])
def test_a_version_pointer_names_one_folder_beside_it(sidecar, tmp_path, pointer):
    """A sidecar's CURRENT that is not one folder name beside it (damaged, or leading elsewhere)
    is refused as corrupt, never followed."""
    from hubless._atomic import current_dir
    from hubless.attached import read_sidecar
    from hubless.errors import Corrupt

    source, _ = sidecar
    shutil.copytree(source / "side", tmp_path / "side")
    (tmp_path / "side" / "CURRENT").write_bytes(pointer)
    for read in (current_dir, read_sidecar):
        with pytest.raises(Corrupt, match="CURRENT"):
            read(tmp_path / "side")


@pytest.mark.parametrize(
    "load", [lambda p: load_array(f"{p}:scores"), lambda p: load_scores(f"{p}:scores")], ids=["load_array", "load_scores"]
)
def test_an_archive_member_with_a_damaged_header_is_refused(tmp_path, load):
    """A large .npz member is parsed before its CRC is checked (at the member's end): a damaged
    header dict raised the tokenizer's own error; it is a HublessError naming the file."""
    np.savez(tmp_path / "s.npz", scores=np.ones((300_000, 4), np.float32))
    data = (tmp_path / "s.npz").read_bytes()
    at = data.index(b"(300000, 4)")
    (tmp_path / "bad.npz").write_bytes(data[:at] + b"(300000, 4 " + data[at + 11 :])  # the shape's tuple left open
    with pytest.raises(HublessError, match="bad.npz"):
        load(tmp_path / "bad.npz")


def test_a_sidecar_opened_as_an_index_is_named_as_a_sidecar(sidecar):
    """An index command given a sidecar folder (both keep a CURRENT pointer) says what the
    folder is and how to use it, instead of calling the pointer corrupt."""
    from hubless.errors import InvalidInput

    source, _ = sidecar
    with pytest.raises(InvalidInput, match="sidecar.*not an index"):
        hubless.Index.load(source / "side")


@pytest.mark.parametrize(
    "name", ["ids.npy", "bias.npy", "reserve_ids.npy", "reserve.npy", "digests.npy", "scale.npy", "statistics.npz", "attach.json"]
)
def test_a_changed_byte_in_a_sidecar_is_found_by_its_checksum(sidecar, tmp_path, name):
    """A byte flipped in an array's data (not its header) still reads as an array: another id
    or bias, or an id beyond the table (an IndexError in the search, found in CI). Each file's
    sha256 is recorded in attach.json, and attach.json's own, so any change is Corrupt at open."""
    from hubless.attached import AttachedCollection
    from hubless.errors import Corrupt

    source, _ = sidecar
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    victim = next((tmp_path / "side").glob(f"v-*/{name}"))
    data = bytearray(victim.read_bytes())
    at = len(data) - 3 if name != "attach.json" else data.index(b'"spec": "nnn:alpha=0.') + 21  # the alpha's first digit
    data[at] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(Corrupt, match=f"{name} is corrupt"):
        AttachedCollection.open(str(tmp_path / "c.faiss"), tmp_path / "side")
