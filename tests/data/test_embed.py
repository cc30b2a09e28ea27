"""`hubless embed`: corrupt and non-image files are skipped and listed; output stays aligned
with metadata; an interrupted job resumes without redoing finished chunks."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hubless.cli.main import app  # noqa: E402
from hubless.encoders import load_encoder  # noqa: E402
from hubless.encoders.job import embed_to_file  # noqa: E402
from tests.models import random_images, save_tiny  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return save_tiny("clip", tmp_path_factory.mktemp("clip"))


@pytest.fixture()
def image_folder(tmp_path):
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    for i, img in enumerate(random_images(5)):
        img.save(folder / ("sub" if i == 3 else "") / f"img{i}.png")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / "notes.txt").write_text("not an image")
    good = folder / "img1.png"
    (folder / "truncated.png").write_bytes(good.read_bytes()[:100])
    return folder


def test_embed_images_skips_bad_files_and_stays_aligned(clip_dir, image_folder, tmp_path):
    out = tmp_path / "emb.npy"
    result = runner.invoke(
        app, ["embed", "--model", str(clip_dir), "--images", str(image_folder), "--out", str(out), "--chunk-size", "3", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "skipped 3" in result.output
    emb = np.load(out)
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    assert emb.shape == (5, meta["dim"]) and meta["count"] == 5 and meta["modality"] == "image"
    assert sorted(s["path"].rsplit("/", 1)[1] for s in meta["skipped"]) == ["broken.jpg", "notes.txt", "truncated.png"]
    enc = load_encoder(clip_dir, device="cpu")
    direct = enc.encode_images([item["path"] for item in meta["items"]])
    np.testing.assert_allclose(emb, direct, atol=1e-5)
    assert not (tmp_path / "emb.npy.parts").exists()
    again = runner.invoke(app, ["embed", "--model", str(clip_dir), "--images", str(image_folder), "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.output


def test_interrupted_job_resumes_without_redoing_chunks(clip_dir, tmp_path):
    enc = load_encoder(clip_dir, device="cpu")
    texts = [f"a photo of {n} dog" for n in ("one", "two", "a", "the", "red", "blue", "green")]
    calls = []
    real = enc.encode_texts

    def flaky(batch, **kwargs):
        calls.append(len(batch))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user pressed Ctrl-C during the third chunk
        return real(batch, **kwargs)

    enc.encode_texts = flaky
    out = tmp_path / "t.npy"
    with pytest.raises(KeyboardInterrupt):
        embed_to_file(enc, out, texts=texts, chunk_size=2)
    assert not out.exists() and len(list((tmp_path / "t.npy.parts").glob("chunk-*.npy"))) == 2
    calls.clear()
    result = embed_to_file(enc, out, texts=texts, chunk_size=2)
    assert result.reused_chunks == 2 and calls == [2, 1]  # only chunks 3 and 4 were encoded
    np.testing.assert_allclose(np.load(out), real(texts), atol=1e-6)
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert [item["text"] for item in meta["items"]] == texts


def test_damaged_or_swapped_chunks_are_redone_saying_so(clip_dir, tmp_path):
    """Chunks say what they hold: a truncated, altered, record-less or swapped chunk of an
    interrupted job is re-encoded with one warning line each; intact ones are kept."""
    import shutil
    import warnings

    from hubless.storage.workfiles import RecomputedWarning

    enc = load_encoder(clip_dir, device="cpu")
    texts = [f"a photo of {n} dog" for n in range(12)]
    real = enc.encode_texts
    calls = []

    def stops_at_the_last_chunk(batch, **kwargs):
        calls.append(len(batch))
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(batch, **kwargs)

    enc.encode_texts = stops_at_the_last_chunk
    out = tmp_path / "t.npy"
    with pytest.raises(KeyboardInterrupt):
        embed_to_file(enc, out, texts=texts, chunk_size=2)
    parts = tmp_path / "t.npy.parts"
    chunk = [parts / f"chunk-{i:06d}.npy" for i in range(6)]
    chunk[0].write_bytes(chunk[0].read_bytes()[:-8])  # truncated
    raw = bytearray(chunk[1].read_bytes())
    raw[-5] ^= 0x40  # a value altered
    chunk[1].write_bytes(bytes(raw))
    (parts / "chunk-000002.json").unlink()  # written, but not its record
    shutil.copy(chunk[4], chunk[3])  # another chunk's embeddings and record
    shutil.copy(parts / "chunk-000004.json", parts / "chunk-000003.json")
    calls.clear()
    enc.encode_texts = lambda batch, **kwargs: calls.append(len(batch)) or real(batch, **kwargs)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = embed_to_file(enc, out, texts=texts, chunk_size=2)
    lines = sorted(str(w.message) for w in record if issubclass(w.category, RecomputedWarning))
    assert len(lines) == 4 and all(line.endswith("recomputing it") for line in lines), lines
    assert "chunk-000000.npy does not match its recorded checksum" in lines[0]
    assert "chunk-000001.npy does not match its recorded checksum" in lines[1]
    assert "chunk-000002.npy has no readable record" in lines[2]
    assert "chunk-000003.npy is recorded as chunk 4" in lines[3]
    assert result.reused_chunks == 1 and calls == [2, 2, 2, 2, 2]  # chunk 4 kept; 0-3 and 5 encoded
    np.testing.assert_allclose(np.load(out), real(texts), atol=1e-6)


def test_embed_texts_cli_and_errors(clip_dir, tmp_path):
    (tmp_path / "caps.txt").write_text("a dog\n\ntwo cats\n")
    out = tmp_path / "caps.npy"
    result = runner.invoke(app, ["embed", "--model", str(clip_dir), "--texts", str(tmp_path / "caps.txt"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert np.load(out).shape[0] == 2
    result = runner.invoke(app, ["embed", "--model", str(clip_dir), "--out", str(tmp_path / "x.npy")])
    assert result.exit_code != 0 and "exactly one" in result.output
    result = runner.invoke(
        app, ["embed", "--model", str(tmp_path / "nope"), "--texts", str(tmp_path / "caps.txt"), "--out", str(tmp_path / "y.npy")]
    )
    assert result.exit_code == 2 and "error" in result.output


def test_embed_with_no_readable_image_fails_and_writes_nothing(clip_dir, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"\xff\xd8 nope")
    (folder / "b.txt").write_text("not an image")
    out = tmp_path / "emb.npy"
    result = runner.invoke(app, ["embed", "--model", str(clip_dir), "--images", str(folder), "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "none of the 2 images could be read" in result.output and "a.jpg" in result.output and "b.txt" in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no .npy, no .meta.json, no .parts


def test_embeddings_and_metadata_stay_one_unit(clip_dir, tmp_path):
    """A crash between writing OUT.npy and OUT.meta.json leaves new embeddings beside old
    metadata: the metadata names its embeddings' checksum, so using the pair is refused."""
    enc = load_encoder(clip_dir, device="cpu")
    out = tmp_path / "t.npy"
    embed_to_file(enc, out, texts=["a dog", "a cat", "a red car"])
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert meta["embeddings_sha256"] and meta["embeddings"] == "t.npy"
    np.save(tmp_path / "bank.npy", enc.encode_texts(["one dog", "two cats", "the red ball", "a man"]))
    build = ["index", "build", "--gallery", str(out), "--query-bank", str(tmp_path / "bank.npy"), "--method", "nnn:k=2",
             "--metadata", str(tmp_path / "t.meta.json"), "--out"]  # fmt: skip
    assert runner.invoke(app, [*build, str(tmp_path / "idx")]).exit_code == 0
    embed_to_file(enc, tmp_path / "new.npy", texts=["two dogs", "a green bike", "a man"])
    (tmp_path / "new.npy").replace(out)  # the new embeddings landed, the old metadata stayed
    result = runner.invoke(app, [*build, str(tmp_path / "idx2")])
    assert result.exit_code == 2 and "another version" in result.output and not (tmp_path / "idx2").exists()


EMBED_SCRIPT = """
import sys
from hubless.encoders import load_encoder
from hubless.encoders.job import embed_to_file
enc = load_encoder(sys.argv[1], device="cpu")
texts = [f"a photo of {i} red dogs on grass" for i in range(400)]
embed_to_file(enc, sys.argv[2], texts=texts, chunk_size=25, batch_size=5, progress=False, overwrite=True)
"""


@pytest.mark.slow
def test_kill_during_embed_then_resume_gives_the_clean_result(clip_dir, tmp_path):
    """kill -9 an embedding job at random moments, rerun it: the result equals an uninterrupted
    run, and embeddings and metadata always describe each other."""
    import os
    import random
    import signal
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(EMBED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "e.npy"
    rng = random.Random(1)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, str(script), str(clip_dir), str(out)], env=env)
        time.sleep(rng.uniform(2.0, 5.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if out.exists():  # finished before the kill: the pair must match
            meta = json.loads((tmp_path / "e.meta.json").read_text())
            assert meta["count"] == np.load(out).shape[0]
    done = subprocess.run([sys.executable, str(script), str(clip_dir), str(out)], env=env, timeout=300)
    assert done.returncode == 0
    clean = tmp_path / "clean.npy"
    enc = load_encoder(clip_dir, device="cpu")
    embed_to_file(enc, clean, texts=[f"a photo of {i} red dogs on grass" for i in range(400)], chunk_size=25, batch_size=5, progress=False)
    np.testing.assert_allclose(np.load(out), np.load(clean), atol=1e-6)
    meta = json.loads((tmp_path / "e.meta.json").read_text())
    from hubless._atomic import file_sha256

    assert meta["embeddings_sha256"] == file_sha256(out) and not (tmp_path / "e.npy.parts").exists()
