"""`hubless search --text/--texts/--image`: queries encoded with the index's model give the same
results as pre-embedded queries; clear errors when no model is known or dimensions differ."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hubless.cli.main import app  # noqa: E402
from hubless.encoders import encode_queries, load_encoder  # noqa: E402
from hubless.index import Index  # noqa: E402
from tests.models import random_images, save_tiny  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("search-text")
    model = save_tiny("clip", root / "clip")
    enc = load_encoder(model, device="cpu")
    images = random_images(12)
    for i, img in enumerate(images):
        img.save(root / f"img{i}.png")
    paths = [str(root / f"img{i}.png") for i in range(12)]
    gallery = enc.encode_images(paths)
    bank = enc.encode_texts([f"a photo of {w} dog" for w in ("one", "two", "red", "blue", "green", "the")] * 3)
    index = Index.build(gallery, bank, "nnn:alpha=0.5,k=3", "Flat", metadata=[{"path": p} for p in paths], model=str(model))
    index.save(root / "idx")
    Index.build(gallery, bank, "nnn:alpha=0.5,k=3", "Flat").save(root / "nomodel")
    return root, model, enc, paths


def _results(output: str) -> list[list[int]]:
    return [[hit["id"] for hit in json.loads(line)["hits"]] for line in output.strip().splitlines()]


def test_text_queries_match_embedded_queries(setup):
    root, model, enc, _ = setup
    queries = ["a red dog on grass", "two cats"]
    result = runner.invoke(app, ["search", str(root / "idx"), "--text", queries[0], "--text", queries[1], "--top-k", "5", "--json"])
    assert result.exit_code == 0, result.output
    index = Index.load(root / "idx")
    _, ids = index.search(enc.encode_texts(queries), 5)
    assert _results(result.output) == ids.tolist()
    assert [json.loads(line)["text"] for line in result.output.strip().splitlines()] == queries
    (root / "q.txt").write_text("\n".join(queries) + "\n")
    from_file = runner.invoke(app, ["search", str(root / "idx"), "--texts", str(root / "q.txt"), "--top-k", "5", "--json"])
    assert from_file.exit_code == 0 and _results(from_file.output) == ids.tolist()


def test_image_query_finds_itself(setup):
    root, _, _, paths = setup
    result = runner.invoke(app, ["search", str(root / "idx"), "--image", paths[3], "--top-k", "3", "--json", "--weight", "0"])
    assert result.exit_code == 0, result.output
    assert _results(result.output)[0][0] == 3  # uncorrected, an image is its own nearest neighbour


def test_model_option_overrides_and_errors(setup):
    root, model, enc, _ = setup
    ok = runner.invoke(app, ["search", str(root / "nomodel"), "--text", "a dog", "--model", str(model), "--json"])
    assert ok.exit_code == 0, ok.output
    missing = runner.invoke(app, ["search", str(root / "nomodel"), "--text", "a dog"])
    assert missing.exit_code == 2 and "records no model" in missing.output and "--model" in missing.output
    both = runner.invoke(app, ["search", str(root / "idx"), "--text", "a dog", "--queries", str(root / "q.txt")])
    assert both.exit_code == 2 and "exactly one of" in both.output
    other = save_tiny("siglip", root / "siglip")  # 32-dimensional, the index holds 16
    other_model = runner.invoke(app, ["search", str(root / "idx"), "--text", "a dog", "--model", str(other)])
    assert other_model.exit_code == 2 and "would not be comparable" in other_model.output and "--allow-model-mismatch" in other_model.output
    wrong = runner.invoke(app, ["search", str(root / "idx"), "--text", "a dog", "--model", str(other), "--allow-model-mismatch"])
    assert wrong.exit_code == 2 and "32-dimensional" in wrong.output and "Traceback" not in wrong.output
    bad = root / "bad.png"
    bad.write_bytes(b"not a png")
    unreadable = runner.invoke(app, ["search", str(root / "idx"), "--image", str(bad)])
    assert unreadable.exit_code == 2 and "cannot read query image" in unreadable.output


def test_encode_queries_library(setup):
    _, model, enc, paths = setup
    np.testing.assert_allclose(encode_queries(model, texts=["a dog"]), enc.encode_texts(["a dog"]), atol=1e-6)
    np.testing.assert_allclose(encode_queries(enc, images=paths[:2]), enc.encode_images(paths[:2]), atol=1e-6)
    with pytest.raises(ValueError, match="exactly one"):
        encode_queries(enc)
    with pytest.raises(ValueError, match="non-empty"):
        encode_queries(enc, texts=[""])


def test_a_store_is_searched_by_text_with_the_model_it_records(setup, tmp_path):
    """`hubless search lancedb://... --text`: the store keeps the index's model name, so text
    queries are encoded as for the index and give its results (an exact store: an ANN knob
    such as --nprobe is refused there, see tests/export/test_store_contract.py)."""
    pytest.importorskip("lancedb")
    root, model, enc, _ = setup
    uri = f"lancedb://{tmp_path}/stores/g"
    exported = runner.invoke(app, ["export", str(root / "idx"), "--to", uri])
    assert exported.exit_code == 0, exported.output
    queries = ["a red dog on grass", "two cats"]
    args = ["search", uri, "--text", queries[0], "--text", queries[1], "--top-k", "5", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    _, ids = Index.load(root / "idx").search(enc.encode_texts(queries), 5)
    assert _results(result.output) == ids.tolist()
    assert [json.loads(line)["text"] for line in result.output.strip().splitlines()] == queries
    refused = runner.invoke(app, ["search", uri, "--text", "a dog", "--rerank", str(model)])
    assert refused.exit_code == 2 and "reranking is not offered" in refused.output
    runner.invoke(app, ["export", str(root / "nomodel"), "--to", f"lancedb://{tmp_path}/stores/n"])
    no_model = runner.invoke(app, ["search", f"lancedb://{tmp_path}/stores/n", "--text", "a dog"])
    assert no_model.exit_code == 2 and "records no model" in no_model.output
