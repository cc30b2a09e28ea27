"""Embedding on Ray (issue 20): Ray Data workers encode the single-machine job's chunks; the
output equals the single-machine job's, and a rerun computes only the missing chunks."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hubless.distributed as hd
from hubless.encoders import load_encoder
from hubless.encoders.job import embed_to_file
from tests.models import random_images, save_tiny

TEXTS = [f"a photo of {n} dogs on the grass near a red car" for n in ("one", "two")] * 9 + ["a cat", "the man runs"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return save_tiny("clip", tmp_path_factory.mktemp("clip"))


def test_ray_embedding_of_images_skips_bad_files_and_resumes_missing_chunks(ray_local, clip_dir, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i, img in enumerate(random_images(10)):
        img.save(folder / f"img{i:02d}.png")
    (folder / "broken.jpg").write_bytes(b"not an image")
    items = sorted(str(p) for p in folder.iterdir())
    want = embed_to_file(load_encoder(clip_dir, device="cpu"), tmp_path / "one.npy", images=items, chunk_size=4, progress=False)
    # a crashed Ray job: chunk 1 of 3 finished, then the job stopped
    out = tmp_path / "ray.npy"
    parts = out.with_name(out.name + ".parts")
    from hubless.encoders.job import _job_key, embed_chunk

    encoder = load_encoder(clip_dir, device="cpu")
    parts.mkdir()
    (parts / "job.json").write_text(json.dumps({"key": _job_key(encoder, "image", items, 4)}))
    embed_chunk(encoder, parts, 1, items, "image", 4, 32)
    got = hd.embed(clip_dir, out, images=items, chunk_size=4, device="cpu", progress=False)
    assert got.reused_chunks == 1  # chunk 1 was kept, chunks 0 and 2 were encoded by the workers
    np.testing.assert_allclose(np.load(got.out), np.load(want.out), rtol=1e-6, atol=1e-6)
    assert [s["path"] for s in got.skipped] == [str(folder / "broken.jpg")]


def test_embed_cli_with_ray(ray_local, clip_dir, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS))
    result = CliRunner().invoke(
        app, ["embed", "--model", str(clip_dir), "--texts", str(texts), "--out", str(tmp_path / "e.npy"), "--ray", "--chunk-size", "8"]
    )
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "e.npy").shape[0] == len(TEXTS)


def test_ray_embedding_writes_the_same_files_as_the_single_machine_job(ray_local, clip_dir, tmp_path):
    (tmp_path / "one").mkdir(), (tmp_path / "ray").mkdir()
    want = embed_to_file(load_encoder(clip_dir, device="cpu"), tmp_path / "one" / "e.npy", texts=TEXTS, chunk_size=8, progress=False)
    got = hd.embed(clip_dir, tmp_path / "ray" / "e.npy", texts=TEXTS, chunk_size=8, workers=2, device="cpu", progress=False)
    assert np.load(got.out).dtype == np.float32
    np.testing.assert_allclose(np.load(got.out), np.load(want.out), rtol=1e-6, atol=1e-6)
    assert got.out.read_bytes() == want.out.read_bytes()
    assert got.meta.read_text() == want.meta.read_text()  # embeddings_sha256 included
    assert not got.out.with_name("e.npy.parts").exists()


def test_ray_resume_keeps_finished_chunks_and_encodes_only_the_missing_one(ray_local, clip_dir, tmp_path):
    """Chunks 0 and 2 of 3 are on disk (marked: their embeddings negated); only chunk 1 is encoded."""
    from hubless.encoders.job import _job_key, embed_chunk, write_chunk

    encoder = load_encoder(clip_dir, device="cpu")
    want = np.load(embed_to_file(encoder, tmp_path / "one.npy", texts=TEXTS, chunk_size=8, progress=False).out)
    out = tmp_path / "ray.npy"
    parts = out.with_name(out.name + ".parts")
    parts.mkdir()
    (parts / "job.json").write_text(json.dumps({"key": _job_key(encoder, "text", TEXTS, 8)}))
    for chunk in (0, 2):  # written (and recorded) by an earlier run: kept whatever they hold
        embed_chunk(encoder, parts, chunk, TEXTS, "text", 8, 32)
        ok = json.loads((parts / f"chunk-{chunk:06d}.json").read_text())["ok"]
        write_chunk(parts, chunk, -np.load(parts / f"chunk-{chunk:06d}.npy"), ok, [])
    got = hd.embed(clip_dir, out, texts=TEXTS, chunk_size=8, workers=2, device="cpu", progress=False)
    assert got.reused_chunks == 2
    emb = np.load(got.out)
    np.testing.assert_array_equal(emb[:8], -want[:8])  # kept as found: not recomputed
    np.testing.assert_array_equal(emb[16:], -want[16:])
    np.testing.assert_allclose(emb[8:16], want[8:16], rtol=1e-6, atol=1e-6)  # the missing chunk, encoded by a worker


def test_ray_embed_without_ray_names_the_distributed_extra(clip_dir, tmp_path, monkeypatch):
    import sys

    from hubless.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not importable, as when it is not installed
    with pytest.raises(MissingDependency, match=r"hubless\[distributed\]"):
        hd.embed(clip_dir, tmp_path / "e.npy", texts=TEXTS, progress=False)
    assert not (tmp_path / "e.npy.parts").exists()


def test_ray_embed_cli_reports_a_missing_input_as_without_ray(tmp_path, clip_dir):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    args = ["embed", "--model", str(clip_dir), "--images", str(tmp_path / "nowhere"), "--out", str(tmp_path / "e.npy")]
    plain, with_ray = CliRunner().invoke(app, args), CliRunner().invoke(app, [*args, "--ray"])
    assert plain.exit_code == with_ray.exit_code != 0
    assert "nowhere" in with_ray.output and with_ray.output == plain.output
