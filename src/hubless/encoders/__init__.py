"""Encoders: turn images and texts into L2-normalised float32 embeddings with real models.

    enc = hubless.encoders.load_encoder("openai/clip-vit-base-patch32")   # or a local folder
    images = enc.encode_images(["a.jpg", "b.jpg"])
    texts = enc.encode_texts(["a dog", "a cat"])
    q = hubless.encoders.encode_queries(index.model, texts=["a dog on a beach"])  # an index's model

Hugging Face transformers CLIP, SigLIP and BLIP (retrieval projections) and sentence-transformers
text models. They need the ``models`` extra: ``pip install 'hubless[models]'``; importing this
package does not import torch.
"""

from hubless.encoders.base import ENCODERS, Encoder
from hubless.encoders.loader import load_encoder
from hubless.encoders.queries import encode_queries

__all__ = ["ENCODERS", "Encoder", "encode_queries", "load_encoder"]
