"""Caption splits of COCO / Flickr30k from the shared data directory (and a fake one)."""

from __future__ import annotations

import pytest

from hubless.data.karpathy import load_captions
from tests.conftest import needs_shared


@needs_shared("coco_karpathy", "flickr30k_karpathy")
def test_loads_the_real_splits_when_present():
    coco = load_captions("coco", "test5k")
    assert len(coco.captions) == 25_000 and coco.n_images == 5000
    assert load_captions("coco", "test1k").captions == coco.captions[:5000]
    flickr = load_captions("flickr30k", "test1k")
    assert flickr.n_images == 1000 and flickr.caption_image[7] == 1
    t2i, i2t = flickr.truth()
    assert t2i.n_queries == 5000 and i2t.n_queries == 1000


def test_custom_root_and_clear_errors(tmp_path, monkeypatch):
    (tmp_path / "flickr30k_karpathy").mkdir()
    (tmp_path / "flickr30k_karpathy" / "dev1k_captions.txt").write_text("\n".join(f"c{i}" for i in range(10)))
    monkeypatch.setenv("HUBLESS_DATA_DIR", str(tmp_path))
    split = load_captions("flickr30k", "dev")
    assert split.n_images == 2 and split.captions[-1] == "c9"
    (tmp_path / "flickr30k_karpathy" / "dev1k_captions.txt").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match="multiple of 5"):
        load_captions("flickr30k", "dev")
    with pytest.raises(FileNotFoundError, match="HUBLESS_DATA_DIR"):
        load_captions("coco", "test5k")
    with pytest.raises(ValueError, match="unknown split"):
        load_captions("coco", "train")
