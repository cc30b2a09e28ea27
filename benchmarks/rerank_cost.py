"""Cost of retrieve + rerank: the second stage grows with k, not with the gallery.

    python benchmarks/rerank_cost.py      # about 2 minutes on 2 CPU cores

A small randomly initialised sentence-transformers CrossEncoder (BERT, 2 layers, hidden 128)
reranks the NNN-corrected top k of synthetic text queries (d 256). Prints the median latency
per query (over repeats) of each stage at gallery 10k and 200k with k = 20 (floor: the rerank
latency ratio 200k / 10k <= 1.3), and at k = 10, 20, 50 on the 10k gallery (about linear in k).
Real weights: pass ``--model cross-encoder/ms-marco-MiniLM-L6-v2`` (text) where you have them;
for images use ``hubless eval --rerank Salesforce/blip-itm-base-coco``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np

import hubless
from hubless.rerank import Pipeline, load_reranker

WORDS = "a an the dog cat man woman child car bike street grass ball red blue green sits runs plays near with".split()


def tiny_cross_encoder(folder: str) -> str:
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + WORDS + [str(i) for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", model_max_length=64
    )
    cfg = tf.BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=64, num_labels=1)  # fmt: skip
    tf.BertForSequenceClassification(cfg).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def sentences(rng, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=8)) + f" {i % 100}" for i in range(n)]


def measure(pipe, queries, items, repeats: int) -> dict[str, float]:
    first, second = [], []
    for _ in range(repeats):
        result = pipe.search(queries, items, top_k=min(10, pipe.k), progress=False)
        first.append(result.seconds["first_stage"] / len(items))
        second.append(result.seconds["rerank"] / len(items))
    return {"retrieve": 1000 * statistics.median(first), "rerank": 1000 * statistics.median(second)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a CrossEncoder name/folder (default: a tiny random one)")
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        reranker = load_reranker(args.model or tiny_cross_encoder(tmp), kind="cross-encoder", device="cpu")
        texts = sentences(rng, 200_000)
        dim = 256
        gallery = rng.standard_normal((200_000, dim), dtype=np.float32)
        bank = rng.standard_normal((20_000, dim), dtype=np.float32)
        queries = rng.standard_normal((args.queries, dim), dtype=np.float32)
        q_items = sentences(rng, args.queries)
        rows = {}
        for n in (10_000, 200_000):
            nnn = hubless.NNN(k=16).fit(gallery[:n], bank, progress=False)
            pipe = Pipeline(nnn, reranker, k=20, gallery_items=texts[:n])
            measure(pipe, queries, q_items, 1)  # warm-up
            rows[("gallery", n)] = measure(pipe, queries, q_items, args.repeats)
        nnn = hubless.NNN(k=16).fit(gallery[:10_000], bank, progress=False)
        for k in (10, 20, 50):
            rows[("k", k)] = measure(Pipeline(nnn, reranker, k=k, gallery_items=texts[:10_000]), queries, q_items, args.repeats)
    print(f"median ms per query over {args.repeats} runs of {args.queries} queries (d {dim}, NNN first stage)\n")
    print("| setting | retrieve ms/query | rerank ms/query |\n|---|---|---|")
    for (kind, value), ms in rows.items():
        label = f"gallery {value:,}, k = 20" if kind == "gallery" else f"gallery 10,000, k = {value}"
        print(f"| {label} | {ms['retrieve']:.2f} | {ms['rerank']:.2f} |")
    ratio = rows[("gallery", 200_000)]["rerank"] / rows[("gallery", 10_000)]["rerank"]
    per_k = [rows[("k", k)]["rerank"] / k for k in (10, 20, 50)]
    print(f"\nrerank latency, gallery 200k / 10k at k = 20: {ratio:.2f}x (floor <= 1.3)")
    print("rerank ms per candidate at k = 10, 20, 50: " + ", ".join(f"{v:.3f}" for v in per_k) + " (about constant = linear in k)")


if __name__ == "__main__":
    main()
