"""`hubless data fetch`: a clear "no network" error, and the caption files from an archive."""

from __future__ import annotations

import hashlib
import io
import json
import urllib.error
import zipfile

import pytest
from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.data import fetch as fetch_module
from hubless.data.karpathy import load_captions

runner = CliRunner()


def fake_archive() -> bytes:
    images = []
    for i in range(3):
        images.append({"filename": f"t{i}.jpg", "split": "test", "sentences": [{"raw": f"test {i} caption {j}"} for j in range(5)]})
    images.append({"filename": "v.jpg", "split": "val", "sentences": [{"raw": f"val caption {j}\n"} for j in range(6)]})
    images.append({"filename": "r.jpg", "split": "train", "sentences": [{"raw": "train"}] * 5})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("data/dataset_flickr30k.json", json.dumps({"images": images}))
    return buf.getvalue()


def test_no_network_gives_a_clear_message(monkeypatch, tmp_path):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(fetch_module.urllib.request, "urlopen", offline)
    result = runner.invoke(app, ["data", "fetch", "coco", "--dest", str(tmp_path)])
    assert result.exit_code == 2
    assert "no network" in result.output and "Traceback" not in result.output
    assert not any(tmp_path.iterdir())


def test_download_is_converted_to_the_caption_files(monkeypatch, tmp_path):
    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    archive = fake_archive()
    monkeypatch.setattr(fetch_module.urllib.request, "urlopen", lambda url, timeout: Response(archive))
    # the fake archive has 3 test images, not the release's 1,000: refused, nothing written
    result = runner.invoke(app, ["data", "fetch", "flickr30k", "--dest", str(tmp_path)])
    assert result.exit_code == 2 and "Karpathy's release has 1000" in result.output and not any(tmp_path.iterdir())
    digest = hashlib.sha256(archive).hexdigest()
    result = runner.invoke(app, ["data", "fetch", "flickr30k", "--dest", str(tmp_path), "--no-verify", "--sha256", "0" * 64])
    assert result.exit_code == 2 and digest in result.output and not any(tmp_path.iterdir())
    result = runner.invoke(app, ["data", "fetch", "flickr30k", "--dest", str(tmp_path), "--no-verify", "--sha256", digest])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "flickr30k_karpathy" / "test1k_captions.txt").read_text().splitlines()
    assert lines[:2] == ["test 0 caption 0", "test 0 caption 1"] and len(lines) == 15
    dev = load_captions("flickr30k", "dev", root=tmp_path)
    assert dev.captions == [f"val caption {j}" for j in range(5)]
    images = tmp_path / "images"
    images.mkdir()
    with pytest.raises(FileNotFoundError, match="1 of 1 images are missing"):
        dev.image_paths(images, root=tmp_path)
    (images / "v.jpg").write_bytes(b"x")
    assert dev.image_paths(images, root=tmp_path) == [images / "v.jpg"]
    # `hubless data export` writes the inputs of `hubless embed`, in the split's order.
    monkeypatch.setenv("HUBLESS_DATA_DIR", str(tmp_path))
    out = tmp_path / "export"
    result = runner.invoke(app, ["data", "export", "flickr30k", "dev", "--out", str(out), "--image-root", str(images)])
    assert result.exit_code == 0, result.output
    assert (out / "captions.txt").read_text().splitlines() == dev.captions
    assert (out / "images.txt").read_text().splitlines() == [str(images / "v.jpg")]
    result = runner.invoke(app, ["data", "export", "flickr30k", "dev", "--out", str(out), "--image-root", str(tmp_path)])
    assert result.exit_code == 2 and "missing" in result.output


def test_corrupt_archive(tmp_path):
    bad = tmp_path / "caption_datasets.zip"
    bad.write_bytes(b"PK\x03\x04 truncated")
    result = runner.invoke(app, ["data", "fetch", "coco", "--dest", str(tmp_path), "--archive", str(bad)])
    assert result.exit_code == 2 and "not a valid zip" in result.output
