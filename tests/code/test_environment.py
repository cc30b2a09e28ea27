"""The library never writes the process environment: importing hubless and using it (fits,
evaluation, tuning, an index, a model read from the Hugging Face cache, a distributed tile task,
the engine's thread setting) leaves ``os.environ`` exactly as it was. Offline mode and thread
counts are passed explicitly (``local_files_only=True``, :func:`hubless.engine.use_threads`).
Each check runs in a fresh interpreter, so nothing imported earlier hides a write."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: threadpoolctl (which the engine uses to keep BLAS single-threaded in its workers) sets
#: KMP_DUPLICATE_LIB_OK when it is imported, as scikit-learn does: its own setting, not
#: hubless's. It is imported before the snapshot, so any change seen after is hubless's.
SNAPSHOT = """
import os, sys
import threadpoolctl  # noqa: F401
before = dict(os.environ)

def check(label):
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if changed:
        sys.exit(f"{label} changed os.environ: {sorted(changed)}")
"""


def run(body: str, env: dict | None = None) -> None:
    code = SNAPSHOT + textwrap.dedent(body) + "\ncheck('the end')\nprint('unchanged')\n"
    environ = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", **(env or {})}
    environ = {k: v for k, v in environ.items() if v is not None}  # None: not set at all
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=environ, cwd=ROOT)
    assert done.returncode == 0 and "unchanged" in done.stdout, done.stdout + done.stderr


def test_importing_and_using_the_core_leaves_the_environment_alone(tmp_path):
    run(
        f"""
        import numpy as np
        import hubless
        check("import hubless")
        from hubless.data import make_retrieval_data
        from hubless.engine import use_threads
        d = make_retrieval_data(n_items=120, dim=16, n_query_bank=300, n_val_items=40)
        hubless.fit_many(["nnn", "is", "dis", "dn", "csls", "gc"], d.gallery, d.query_bank, d.gallery_bank)
        hubless.evaluate(d.gallery, d.queries, d.query_item, d.query_bank, ["nnn", "is"], bootstrap=20, coverage=True)
        hubless.tune(d.val_gallery, d.val_queries, d.val_query_item, d.query_bank, ["nnn"], grids={{"nnn": {{"alpha": (0.5,), "k": (4,)}}}})
        with use_threads(1):
            hubless.NNN(k=4).fit(d.gallery, d.query_bank)
        index = hubless.Index.build(d.gallery, d.query_bank, "nnn:alpha=0.5,k=4", "Flat")
        index.search(d.queries[:5], 3)
        index.save({str(tmp_path / "idx")!r})
        hubless.Index.load({str(tmp_path / "idx")!r}).search(d.queries[:5], 3)
        check("fitting, evaluating, tuning and an index")
        from hubless.distributed.fit import _tile_job, open_sources
        from hubless.distributed.plan import plan_tiles
        np.save({str(tmp_path / "g.npy")!r}, d.gallery)
        np.save({str(tmp_path / "b.npy")!r}, d.query_bank)
        sources = open_sources({str(tmp_path / "g.npy")!r}, {str(tmp_path / "b.npy")!r})
        request = hubless.corrections.statistics_request([hubless.NNN(k=4)])
        for tile in plan_tiles(request, sources["gallery"].n_rows, sources["query_bank"].n_rows, None)[:1]:
            _tile_job(tile, sources["gallery"], sources["query_bank"], request, True, 1)  # what a Ray task runs
        check("a distributed tile task")
        """
    )


@pytest.mark.slow
def test_a_model_from_the_hugging_face_cache_loads_offline_without_touching_the_environment(tmp_path):
    """The cached model is read with local_files_only=True (it used to set HF_HUB_OFFLINE=1 for
    the whole process). The cache is a real one, laid out as huggingface_hub reads it."""
    pytest.importorskip("transformers")
    from tests.models import save_tiny

    cache = tmp_path / "hub"
    snapshot = cache / "models--hubless-test--tiny-clip" / "snapshots" / ("0" * 40)
    save_tiny("clip", snapshot)
    (cache / "models--hubless-test--tiny-clip" / "refs").mkdir()
    (cache / "models--hubless-test--tiny-clip" / "refs" / "main").write_text("0" * 40)
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": None}  # a hub that never answers
    run(
        """
        from hubless.encoders import load_encoder
        encoder = load_encoder("hubless-test/tiny-clip")
        vectors = encoder.encode_texts(["a dog", "a cat"])
        assert vectors.shape == (2, 16), vectors.shape
        check("loading a cached model")
        """,
        env=env,
    )


def test_use_threads_sets_the_engines_threads_explicitly():
    from hubless.engine import use_threads
    from hubless.engine.parallel import num_threads

    before = dict(os.environ)
    with use_threads(1):
        assert num_threads() == 1
        with use_threads(3):
            assert num_threads() == 3
        assert num_threads() == 1
    assert dict(os.environ) == before
    with pytest.raises(ValueError, match="threads"):
        with use_threads(0):
            pass
