"""Tiny randomly initialised CLIP / SigLIP / BLIP checkpoints saved to a folder, loaded back
through the same code a user runs with real weights (no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + (
    "a an the dog dogs cat cats photo picture of on in red blue green man woman child sits runs "
    "plays ball grass street car bike near with two one"
).split()

TEXT = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=24)
VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", model_max_length=24
    )


def save_tiny(kind: str, folder: Path) -> Path:
    """Build a tiny ``kind`` model (clip, siglip, blip) with random weights and save it."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = dict(vocab_size=len(WORDS), pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if kind == "clip":
        model = tf.CLIPModel(tf.CLIPConfig(text_config={**TEXT, **ids}, vision_config=VISION, projection_dim=16))
        processor = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif kind == "siglip":
        model = tf.SiglipModel(tf.SiglipConfig(text_config={**TEXT, **ids}, vision_config=VISION))
        processor = tf.SiglipImageProcessor(size={"height": 32, "width": 32})
    elif kind == "blip":
        text = {**TEXT, **ids, "encoder_hidden_size": 32, "sep_token_id": 3}
        model = tf.BlipForImageTextRetrieval(tf.BlipConfig(text_config=text, vision_config=VISION, image_text_hidden_size=16))
        processor = tf.BlipImageProcessor(size={"height": 32, "width": 32})
    else:
        raise ValueError(kind)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def random_images(n: int, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray((rng.random((40 + i, 50, 3)) * 255).astype(np.uint8)) for i in range(n)]
