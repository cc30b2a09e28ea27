"""Seeded synthetic image-text embeddings with tunable hubness, for demos, tests and benchmarks.

The generative model imitates what makes CLIP-like galleries hubby:

* items belong to topics; an item's content vector is its topic centroid plus item detail;
* a gallery item ("image") is its content plus noise, pulled towards its topic centroid by a
  heavy-tailed (log-normal) popularity times ``hubness``: popular items sit close to every
  caption of their topic and become local hubs, as in real embedding spaces;
* a query ("caption") is its item's content plus stronger noise; each item has
  ``captions_per_item`` captions, caption j describes item j // captions_per_item (the COCO and
  Flickr30k layout);
* the two modalities are offset along one shared direction (a "modality gap");
* optionally (``cone``), a *cone*: every caption leans towards one more shared direction and each
  image by ``cone * U**16`` (U uniform in [0, 1): most images barely, a few almost as much as the
  captions), so the images leaning most become *global* hubs, near every caption whatever its
  topic (the cone effect of contrastive embedding spaces). ``cone=0.5`` gives N10 skewness 10-12
  at 10k-20k x 128 and about 17 at 100k x 256 (10 queries per 100 items; 2.4-3.2 without): strongly
  hub-prone data, where a correction matters most.

The reference banks and the validation split are drawn from the same model with fresh items,
so they never contain the test queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless._validation import check_seed
from hubless.errors import AlreadyExists, InvalidInput

__all__ = ["CONE_POWER", "EXAMPLE_FILES", "SyntheticRetrieval", "make_retrieval_data", "write_example_files"]


#: An image leans ``cone * U**CONE_POWER`` towards the cone's axis (U uniform): a few global hubs.
CONE_POWER = 16


@dataclass
class SyntheticRetrieval:
    """A synthetic retrieval benchmark; all embeddings are float32 and unit-length.

    gallery (n_items, d), queries (n_items * captions_per_item, d), query_item (n_queries,) the
    gallery index each query describes; query_bank and gallery_bank are references drawn from
    other items; val_* is a disjoint split (its own gallery and queries) for tuning; extra_* (with
    ``n_extra_items``) are further items and their captions, drawn last, for growing a gallery.
    """

    gallery: np.ndarray
    queries: np.ndarray
    query_item: np.ndarray
    query_bank: np.ndarray
    gallery_bank: np.ndarray
    val_gallery: np.ndarray
    val_queries: np.ndarray
    val_query_item: np.ndarray
    captions_per_item: int
    extra_gallery: np.ndarray | None = None
    extra_queries: np.ndarray | None = None


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_retrieval_data(
    n_items: int = 1000,
    captions_per_item: int = 5,
    dim: int = 64,
    *,
    n_query_bank: int = 10000,
    n_gallery_bank: int = 2000,
    n_val_items: int = 500,
    hubness: float = 1.0,
    noise: float = 1.0,
    n_topics: int = 25,
    modality_gap: float = 0.3,
    seed: int = 0,
    n_extra_items: int = 0,
    cone: float = 0.0,
) -> SyntheticRetrieval:
    """Generate a benchmark (see the module docstring for the model).

    ``hubness`` scales the popularity pull (0 gives no planted hubs); ``noise`` scales the
    per-embedding noise (higher is harder: with the defaults, text->image R@1 is about 39%
    uncorrected and about 45% with NNN). ``n_extra_items`` draws that many more items (and their
    captions) after everything else, so the other arrays are the same with or without them.
    ``cone`` (>= 0; 0: none) is how far every caption (queries, query bank, validation) leans
    towards the cone's shared direction; each image leans ``cone * U**CONE_POWER``, U uniform,
    drawn from a stream of its own (with ``cone=0`` the arrays are the same as without it).
    """
    for name, value in (("n_items", n_items), ("captions_per_item", captions_per_item), ("dim", dim)):
        if value < 1:
            raise InvalidInput(f"{name} must be >= 1; got {value}")
    if min(n_query_bank, n_gallery_bank, n_val_items, n_topics) < 1:
        raise InvalidInput("bank sizes, n_val_items and n_topics must be >= 1")
    if n_extra_items < 0:
        raise InvalidInput(f"n_extra_items must be >= 0; got {n_extra_items}")
    if isinstance(cone, bool) or not isinstance(cone, (int, float, np.integer, np.floating)) or not 0 <= cone < np.inf:
        raise InvalidInput(f"cone must be a finite number >= 0; got {cone!r}")
    seed = check_seed(seed)
    rng = np.random.default_rng(seed)
    cone_rng = np.random.default_rng([seed, 1])  # the cone's own stream: the other draws are the same without it
    axis = _unit(cone_rng.standard_normal((1, dim)))[0]
    topics = _unit(rng.standard_normal((n_topics, dim)))
    gap = _unit(rng.standard_normal((1, dim)))[0] * modality_gap

    def content(n: int) -> tuple[np.ndarray, np.ndarray]:
        topic = rng.integers(0, n_topics, n)
        return _unit(topics[topic] + _unit(rng.standard_normal((n, dim)))), topic

    def images(c: np.ndarray, topic: np.ndarray) -> np.ndarray:
        popularity = rng.lognormal(0.0, 1.0, len(c))[:, None]
        pull = 0.25 * hubness * popularity * topics[topic]
        x = c + noise * _unit(rng.standard_normal(c.shape)) + pull + gap
        if cone:
            x = _unit(x) + cone * cone_rng.random((len(c), 1)) ** CONE_POWER * axis
        return _unit(x)

    def captions(c: np.ndarray) -> np.ndarray:
        per_caption = np.repeat(c, captions_per_item, axis=0)
        x = per_caption + 1.3 * noise * _unit(rng.standard_normal(per_caption.shape)) - gap
        return _unit(_unit(x) + cone * axis) if cone else _unit(x)

    def split(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c, topic = content(n)
        return images(c, topic), captions(c), np.repeat(np.arange(n), captions_per_item)

    gallery, queries, query_item = split(n_items)
    bank_items = -(-n_query_bank // captions_per_item)
    query_bank = captions(content(bank_items)[0])[:n_query_bank]
    gallery_bank = images(*content(n_gallery_bank))
    val_gallery, val_queries, val_query_item = split(n_val_items)
    extra_gallery, extra_queries, _ = split(n_extra_items) if n_extra_items else (None, None, None)
    return SyntheticRetrieval(
        gallery=gallery,
        queries=queries,
        query_item=query_item,
        query_bank=query_bank,
        gallery_bank=gallery_bank,
        val_gallery=val_gallery,
        val_queries=val_queries,
        val_query_item=val_query_item,
        captions_per_item=captions_per_item,
        extra_gallery=extra_gallery,
        extra_queries=extra_queries,
    )


#: The files :func:`write_example_files` writes, with what each holds: the names every example
#: of the README and the documentation uses.
EXAMPLE_FILES = {
    "images.npy": "the gallery: one embedding per image",
    "captions.npy": "the test queries: 5 captions per image, caption j describes image j // 5 (truth t2i:5)",
    "truth.npy": "the image each caption describes (the same as --truth t2i:5)",
    "bank_captions.npy": "the query bank: captions of other images (reference data the corrections are fitted on)",
    "bank_images.npy": "the gallery bank: other images (DualIS, DualDIS, DN)",
    "val_images.npy": "a validation split for tuning: its own images ...",
    "val_captions.npy": "... their captions ...",
    "val_truth.npy": "... and the image each of them describes",
    "new_images.npy": "100 more images, to add to an index",
    "new.meta.json": "their metadata",
    "more_captions.npy": "1,000 more bank captions, to grow a bank",
    "distractors.npy": "500 images never relevant to any query (eval --distractors)",
    "images.meta.json": "the gallery's metadata (a caption per image), as `hubless embed` writes it",
    "example.json": "what wrote these files (hubless, with the parameters): a rerun may replace them",
}
N_NEW, N_DISTRACTORS, N_MORE_ITEMS = 100, 500, 200


def write_example_files(out, *, n_items: int = 1000, dim: int = 64, seed: int = 0, overwrite: bool = False) -> list:
    """Write :func:`make_retrieval_data`'s benchmark into the folder ``out`` under the names of
    :data:`EXAMPLE_FILES` (the demo's data with the demo's defaults: ``hubless eval`` on them
    reproduces ``hubless demo``'s numbers). Existing files of these names are refused before
    anything is written, unless ``overwrite`` or the folder's ``example.json`` says an earlier
    call wrote them; each file is written atomically. Returns the paths written."""
    import json
    from pathlib import Path

    from hubless._atomic import save_npy, write_text

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AlreadyExists(f"{out} exists and is not a folder")
    existing = [name for name in EXAMPLE_FILES if (out / name).exists() or (out / name).is_symlink()]
    if existing and not (overwrite or _written_here(out / "example.json")):
        raise AlreadyExists(f"{out / existing[0]} exists ({len(existing)} of the files); pass --overwrite to replace them")
    data = make_retrieval_data(n_items=n_items, dim=dim, seed=seed, n_extra_items=N_NEW + N_DISTRACTORS + N_MORE_ITEMS)
    cpi = data.captions_per_item
    extra, extra_captions = data.extra_gallery, data.extra_queries
    assert extra is not None and extra_captions is not None  # made with n_extra_items above
    arrays = {
        "images.npy": data.gallery,
        "captions.npy": data.queries,
        "truth.npy": data.query_item.astype(np.int64),
        "bank_captions.npy": data.query_bank,
        "bank_images.npy": data.gallery_bank,
        "val_images.npy": data.val_gallery,
        "val_captions.npy": data.val_queries,
        "val_truth.npy": data.val_query_item.astype(np.int64),
        "new_images.npy": extra[:N_NEW],
        "distractors.npy": extra[N_NEW : N_NEW + N_DISTRACTORS],
        "more_captions.npy": extra_captions[(N_NEW + N_DISTRACTORS) * cpi :],
    }
    written = [save_npy(out / name, array) for name, array in arrays.items()]

    def meta(n: int, first: int, what: str) -> str:
        items = [{"index": i, "caption": f"{what} {first + i} (synthetic)"} for i in range(n)]
        return json.dumps({"model": "synthetic", "dim": dim, "items": items}, indent=1) + "\n"

    written.append(write_text(out / "images.meta.json", meta(n_items, 0, "image")))
    written.append(write_text(out / "new.meta.json", meta(N_NEW, n_items, "image")))
    from hubless._version import __version__

    marker: dict[str, object] = {"generator": f"hubless {__version__}", "function": "hubless.data.synthetic.write_example_files"}
    marker.update(n_items=n_items, dim=dim, seed=seed, files=[p.name for p in written])
    written.append(write_text(out / "example.json", json.dumps(marker, indent=1) + "\n"))
    return written


def _written_here(marker) -> bool:
    """Whether ``marker`` is the example.json of an earlier :func:`write_example_files`."""
    import json

    try:
        return json.loads(marker.read_text()).get("function") == "hubless.data.synthetic.write_example_files"
    except (OSError, ValueError, AttributeError):
        return False
