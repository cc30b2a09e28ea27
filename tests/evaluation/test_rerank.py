"""Retrieve and rerank: tiny BLIP ITM and CrossEncoder loaded by path; reranking, fusion,
oracle plumbing; `hubless eval --rerank` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.rerank import CallableReranker, Pipeline, fuse, load_reranker, rerank_eval


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(n_items=300, dim=32, n_query_bank=2000, n_val_items=10, seed=5)


def oracle_for(data):
    """Knows the truth: query item i ("q{item}") matches gallery item "g{item}"."""
    return CallableReranker(lambda qs, cs: [5.0 if q[1:] == c[1:] else -5.0 for q, c in zip(qs, cs)])


def test_reranked_order_is_the_cross_encoder_order_within_the_first_stage_top_k(data):
    nnn = hubless.NNN().fit(data.gallery, data.query_bank)
    rng = np.random.default_rng(0)
    logit_of = rng.standard_normal(300)
    pipe = Pipeline(nnn, CallableReranker(lambda qs, cs: [logit_of[int(c[1:])] for c in cs]), k=20,
                    gallery_items=[f"g{i}" for i in range(300)])  # fmt: skip
    q_items = [f"q{i}" for i in data.query_item]
    result = pipe.search(data.queries, q_items, top_k=10)
    _, first_ids = nnn.search(data.queries, 20)
    for row in range(len(q_items)):
        assert set(result.ids[row]) <= set(first_ids[row])  # nothing outside the first stage's top k
        expected = sorted(first_ids[row], key=lambda j: -logit_of[j])[:10]
        assert result.ids[row].tolist() == expected
    np.testing.assert_allclose(result.rerank_scores, logit_of[result.ids], rtol=1e-6)
    with pytest.raises(ValueError, match="more than the k"):
        pipe.search(data.queries, q_items, top_k=30)


def test_fusion_formulas():
    first = np.array([[0.9, 0.5, 0.1]])
    logits = np.array([[-1.0, 2.0, 0.0]])
    sig = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(fuse(first, logits, "add", 0.3), 0.3 * first + 0.7 * sig)
    mm = lambda x: (x - x.min()) / (x.max() - x.min())  # noqa: E731
    np.testing.assert_allclose(fuse(first, logits, "norm_add", 0.3), 0.3 * mm(first) + 0.7 * mm(sig))
    np.testing.assert_array_equal(fuse(first, logits, None, 0.3), logits)
    with pytest.raises(ValueError):
        fuse(first, logits, "max", 0.3)


def test_oracle_reranker_lifts_r1_to_the_first_stage_r_at_k(data):
    nnn = hubless.NNN().fit(data.gallery, data.query_bank)
    pipe = Pipeline(nnn, oracle_for(data), k=20, gallery_items=[f"g{i}" for i in range(300)])
    truth = hubless.Truth.from_labels(data.query_item, 300)
    report = rerank_eval(pipe, data.queries, [f"q{i}" for i in data.query_item], truth, ks=(1, 5, 10, 20))
    first_r20 = 100 * np.mean((nnn.search(data.queries, 20)[1] == data.query_item[:, None]).any(1))
    assert report["retrieve+rerank"]["R@1"] == pytest.approx(first_r20)
    assert report["retrieve"]["R@1"] < report["retrieve+rerank"]["R@1"]
    assert set(report["ms_per_query"]) == {"retrieve", "rerank"}


def test_rerank_evaluation_reranks_every_method_of_an_evaluation_in_one_call(data):
    """The library call behind `hubless eval --rerank`: each method's numbers equal its own
    pipeline's rerank_eval, and land in the result's extra."""
    from hubless.rerank import rerank_evaluation

    truth = hubless.Truth.from_labels(data.query_item, 300)
    ev = hubless.evaluate(data.gallery, data.queries, truth, data.query_bank, ["baseline", "nnn"], ks=(1, 5, 50), bootstrap=0)
    q_items, g_items = [f"q{i}" for i in data.query_item], [f"g{i}" for i in range(300)]
    got = rerank_evaluation(ev, data.queries, q_items, truth, oracle_for(data), g_items, k=20)
    assert list(got) == [r.spec for r in ev.results]
    for r in ev.results:
        alone = rerank_eval(Pipeline(r.correction, oracle_for(data), k=20, gallery_items=g_items), data.queries, q_items, truth, ks=(1, 5))
        assert r.extra["rerank"]["retrieve+rerank"] == alone["retrieve+rerank"] == got[r.spec]["retrieve+rerank"]
        assert set(alone["retrieve"]) == {"R@1", "R@5"}  # R@50 is beyond the reranked top 20
    with pytest.raises(hubless.errors.InvalidInput, match="must match the embeddings"):
        rerank_evaluation(ev, data.queries, q_items[:-1], truth, oracle_for(data), g_items, k=20)


@pytest.fixture(scope="module")
def tiny_blip(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.models import save_tiny

    return save_tiny("blip", tmp_path_factory.mktemp("blip"))


def test_blip_itm_reranker_loaded_by_path(tiny_blip, tmp_path):
    from tests.models import random_images

    torch = pytest.importorskip("torch")
    images = random_images(3)
    paths = []
    for i, img in enumerate(images):
        img.save(tmp_path / f"{i}.png")
        paths.append(str(tmp_path / f"{i}.png"))
    rr = load_reranker(tiny_blip, device="cpu")
    texts = ["a dog on the grass", "two cats", "a red car"]
    scores = rr.score_pairs(texts * 3, [p for p in paths for _ in range(3)])
    # Direct computation with the model's own ITM forward.
    model, tok, proc = rr.model, rr.tokenizer, rr.image_processor
    with torch.no_grad():
        px = proc(images=[img.convert("RGB") for img in images for _ in range(3)], return_tensors="pt")["pixel_values"]
        t = tok(texts * 3, padding=True, return_tensors="pt")
        itm = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], pixel_values=px, use_itm_head=True).itm_score
    np.testing.assert_allclose(scores, (itm[:, 1] - itm[:, 0]).numpy(), atol=1e-4)
    assert len(rr._cache) == 3  # each image went through the vision tower once
    i2t = load_reranker(tiny_blip, device="cpu", direction="image->text")
    np.testing.assert_allclose(i2t.score_pairs([p for p in paths for _ in range(3)], texts * 3), scores, atol=1e-5)


def test_cross_encoder_loaded_by_path(tmp_path):
    pytest.importorskip("sentence_transformers")
    import transformers as tf
    from sentence_transformers import CrossEncoder

    from tests.models import tokenizer

    cfg = tf.BertConfig(vocab_size=len(tokenizer().get_vocab()), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=32, num_labels=1)  # fmt: skip
    tf.BertForSequenceClassification(cfg).save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    rr = load_reranker(tmp_path, device="cpu")
    pairs = (["a dog", "a cat", "two cats"], ["a dog on the grass", "a red car", "two cats"])
    direct = CrossEncoder(str(tmp_path), device="cpu").predict(list(zip(*pairs)), activation_fn=None)
    np.testing.assert_allclose(rr.score_pairs(*pairs), np.asarray(direct).reshape(-1), atol=1e-5)


@pytest.mark.slow  # 36-59 s measured (a BLIP model reranks every method's top k)
def test_eval_cli_with_rerank(tiny_blip, data, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app
    from tests.models import random_images

    n = 40
    for i, img in enumerate(random_images(n)):
        img.save(tmp_path / f"{i}.png")
    (tmp_path / "gallery_items.txt").write_text("\n".join(str(tmp_path / f"{i}.png") for i in range(n)))
    (tmp_path / "query_items.txt").write_text("\n".join(f"a photo of {i % 7} dogs" for i in range(n * 5)))
    np.save(tmp_path / "g.npy", data.gallery[:n])
    np.save(tmp_path / "q.npy", data.queries[: n * 5])
    np.save(tmp_path / "qb.npy", data.query_bank)
    out = tmp_path / "r.json"
    args = ["eval", "--gallery", str(tmp_path / "g.npy"), "--queries", str(tmp_path / "q.npy"), "--truth", "t2i:5",
            "--query-bank", str(tmp_path / "qb.npy"), "-m", "nnn", "--bootstrap", "0", "--rerank", str(tiny_blip),
            "--rerank-k", "8", "--gallery-items", str(tmp_path / "gallery_items.txt"),
            "--query-items", str(tmp_path / "query_items.txt"), "--out", str(out), "--no-progress"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "retrieve -> +rerank" in r.output
    res = json.loads(out.read_text())["results"][1]["rerank"]
    assert res["k"] == 8 and set(res["retrieve"]) == {"R@1", "R@5"}
    assert res["retrieve"]["R@1"] == pytest.approx(json.loads(out.read_text())["results"][1]["metrics"]["R@1"])


def test_search_cli_with_rerank(data, tmp_path):
    pytest.importorskip("sentence_transformers")
    import transformers as tf
    from typer.testing import CliRunner

    from hubless.cli.main import app
    from tests.models import tokenizer

    cfg = tf.BertConfig(vocab_size=len(tokenizer().get_vocab()), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=32, num_labels=1)  # fmt: skip
    tf.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "ce")
    tokenizer().save_pretrained(tmp_path / "ce")
    np.save(tmp_path / "g.npy", data.gallery)
    np.save(tmp_path / "qb.npy", data.query_bank)
    np.save(tmp_path / "q.npy", data.queries[:4])
    (tmp_path / "items.json").write_text(json.dumps([{"text": f"a dog {i}"} for i in range(300)]))
    (tmp_path / "q.txt").write_text("two cats\na red car\none dog\na man\n")
    runner = CliRunner()
    r = runner.invoke(app, ["index", "build", "--gallery", str(tmp_path / "g.npy"), "--query-bank", str(tmp_path / "qb.npy"),
                            "--out", str(tmp_path / "idx"), "--metadata", str(tmp_path / "items.json")])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--top-k", "3", "--json",
                            "--rerank", str(tmp_path / "ce"), "--rerank-k", "10", "--query-items", str(tmp_path / "q.txt")])  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.strip().splitlines() if x.startswith("{")]
    first = hubless.Index.load(tmp_path / "idx").search(data.queries[:4], 10)[1]
    assert len(lines) == 4 and all(set(h["id"] for h in line["hits"]) <= set(first[i]) for i, line in enumerate(lines))
