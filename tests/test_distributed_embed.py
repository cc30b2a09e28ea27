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


def test_ray_embedding_of_texts_equals_the_single_machine_job(ray_local, clip_dir, tmp_path):
    want = embed_to_file(load_encoder(clip_dir, device="cpu"), tmp_path / "one.npy", texts=TEXTS, chunk_size=6, progress=False)
    got = hd.embed(clip_dir, tmp_path / "ray.npy", texts=TEXTS, chunk_size=6, workers=2, device="cpu", progress=False)
    np.testing.assert_allclose(np.load(got.out), np.load(want.out), rtol=1e-6, atol=1e-6)
    got_meta, want_meta = json.loads(got.meta.read_text()), json.loads(want.meta.read_text())
    for key in ("model", "modality", "dim", "count", "items", "skipped"):
        assert got_meta[key] == want_meta[key]


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
