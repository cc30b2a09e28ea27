"""No command answers bad input with a Python traceback: each case below is one clear line and
a non-zero exit; damaged .npy headers are refused, never loaded with another shape."""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.inputs import load_array
from tests.conftest import unit_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(4)
    np.save(root / "g.npy", unit_rows(rng, 300, 8))
    np.save(root / "b.npy", unit_rows(rng, 200, 8))
    np.save(root / "q.npy", unit_rows(rng, 300, 8))
    (root / "huge_ids.json").write_text(json.dumps([[2**70]] * 300))
    (root / "adir").mkdir()
    os.mkfifo(root / "fifo")
    raw = bytearray((root / "g.npy").read_bytes())
    raw[raw.index(b"(") + 1 : raw.index(b"(") + 4] = b"-30"  # shape (-30...
    (root / "negative.npy").write_bytes(bytes(raw))
    result = runner.invoke(
        app, ["index", "build", "--gallery", str(root / "g.npy"), "--query-bank", str(root / "b.npy"), "--out", str(root / "idx")]
    )
    assert result.exit_code == 0, result.output
    for name, payload in (("bad_json.zip", b"{not json"), ("no_images.zip", json.dumps({"images": []}).encode())):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("dataset_coco.json", payload)
        (root / name).write_bytes(buf.getvalue())
    return root


def eval_args(root, gallery="g.npy", truth="t2i:1", method="nnn"):
    return ["eval", "--gallery", str(root / gallery), "--queries", str(root / "q.npy"), "--truth", truth if ":" in truth else str(root / truth),
            "--query-bank", str(root / "b.npy"), "-m", method, "--bootstrap", "0"]  # fmt: skip


CASES = {
    "truth id beyond int64": (lambda r: eval_args(r, truth="huge_ids.json"), "no gallery position"),
    "k larger than the bank": (lambda r: eval_args(r, method="nnn:k=100000"), "exceeds the size of the query bank"),
    "negative shape": (lambda r: eval_args(r, gallery="negative.npy"), "invalid shape"),
    "an empty directory as embeddings": (lambda r: eval_args(r, gallery="adir"), "holds no .npy or .parquet shards"),
    "a FIFO as embeddings": (lambda r: eval_args(r, gallery="fifo"), "not a regular file"),
    "a missing file": (lambda r: eval_args(r, gallery="nope.npy"), "no such file"),
    "nprobe -1": (lambda r: ["search", str(r / "idx"), "--queries", str(r / "q.npy"), "--nprobe", "-1"], "nprobe must be >= 1"),
    "nprobe 0": (lambda r: ["search", str(r / "idx"), "--queries", str(r / "q.npy"), "--nprobe", "0"], "nprobe must be >= 1"),
    "ef_search -1": (lambda r: ["search", str(r / "idx"), "--queries", str(r / "q.npy"), "--ef-search", "-1"], "ef_search must be >= 1"),
    "demo with no items": (lambda r: ["demo", "--n-items", "0", "--report", ""], "n_items must be >= 1"),
    "beta out of range": (lambda r: eval_args(r, method="is:beta=1e39"), "between"),
    "fetch: not a Karpathy file": (
        lambda r: ["data", "fetch", "coco", "--dest", str(r / "d1"), "--archive", str(r / "bad_json.zip")],
        "not a Karpathy",
    ),
    "fetch: no images": (
        lambda r: ["data", "fetch", "coco", "--dest", str(r / "d2"), "--archive", str(r / "no_images.zip")],
        "nothing was written",
    ),
    "index that is a file": (lambda r: ["index", "info", str(r / "g.npy")], "not a directory"),
    # found by tests/cli/test_cli_fuzz.py: numpy's own errors before
    "visogender of dimension -1": (lambda r: ["data", "visogender", "--out", str(r / "vg"), "--dim", "-1"], "dim must be >= 1"),
    "a negative seed": (lambda r: ["data", "synthetic", "--out", str(r / "syn"), "--seed", "-1"], "seed must be >= 0"),
    "a negative bootstrap seed": (lambda r: [*eval_args(r)[:-2], "--bootstrap", "10", "--seed", "-2"], "seed must be >= 0"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_clear_line(files, case):
    make_args, expected = CASES[case]
    result = runner.invoke(app, make_args(files))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # handled, not escaping as a traceback
    assert "Traceback" not in result.output and expected in result.output, result.output
    assert not (files / "d2" / "coco_karpathy").exists()


def test_unexpected_errors_are_one_line_unless_debugging(files, monkeypatch):

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr("hubless.index.Index.info", broken)
    result = runner.invoke(app, ["index", "info", str(files / "idx")])
    assert result.exit_code == 1 and "unexpected RuntimeError: something nobody expected" in result.output
    assert "--debug" in result.output and "Traceback" not in result.output
    monkeypatch.setenv("HUBLESS_DEBUG", "1")
    result = runner.invoke(app, ["index", "info", str(files / "idx")])
    assert isinstance(result.exception, RuntimeError)


def test_every_single_bit_flip_of_a_npy_header_is_caught(files):
    """1,024 flips of the first 128 bytes: refused with a ValueError, or (a flip that keeps the
    header meaning the same) loaded with the original shape, dtype and values. Never another shape."""
    original = (files / "g.npy").read_bytes()
    expected = np.load(files / "g.npy")
    target = files / "flipped.npy"
    loaded_same = 0
    for bit in range(128 * 8):
        raw = bytearray(original)
        raw[bit // 8] ^= 1 << (bit % 8)
        target.write_bytes(bytes(raw))
        try:
            got = np.asarray(load_array(target, mmap=False))
        except ValueError:
            continue
        assert got.shape == expected.shape and got.dtype == expected.dtype and np.array_equal(got, expected), bit
        loaded_same += 1
    assert loaded_same < 100  # most flips are refused


def test_embed_with_a_bogus_device(tmp_path):
    pytest.importorskip("transformers")
    from tests.models import save_tiny

    model = save_tiny("clip", tmp_path / "clip")
    (tmp_path / "t.txt").write_text("a dog\n")
    result = runner.invoke(
        app, ["embed", "--model", str(model), "--texts", str(tmp_path / "t.txt"), "--out", str(tmp_path / "e.npy"), "--device", "bogus"]
    )
    assert result.exit_code == 2 and "unknown device 'bogus'" in result.output and "Traceback" not in result.output
