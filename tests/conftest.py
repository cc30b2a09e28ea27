"""Shared fixtures: small random embedding sets and a clean warning state per test; the
``needs_shared`` marker (tests that need the benchmark data of ../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hubless._validation import _reset_warnings
from tests.checkout import git_status, left_behind

#: The checkout the tests run from (a clone, a worktree, or no git checkout at all).
CHECKOUT = Path(__file__).resolve().parents[1]
#: ``git status`` of the checkout when the session started (None: not a git checkout).
_STATUS_AT_START: dict[str, set[str] | None] = {}


def pytest_sessionstart(session):
    _STATUS_AT_START["status"] = git_status(CHECKOUT)


@pytest.fixture(scope="session", autouse=True)
def _the_checkout_is_left_as_it_was():
    """At the end of the run: fail (an error at the teardown of the last test) when the checkout
    has files git does not ignore, or changed files, that were not there when the run started.
    Tests write under ``tmp_path``; outside a git checkout there is nothing to compare."""
    yield
    new = left_behind(_STATUS_AT_START.get("status"), git_status(CHECKOUT))
    if new:
        pytest.fail(
            f"the test run left {len(new)} file(s) in the checkout that git does not ignore (write under tmp_path): {', '.join(new)}",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _reset_warnings()
    yield
    _reset_warnings()


def interrupt_after_first(iterable, progress, **kwargs):
    """A progress bar that stops the work with Ctrl-C after its first step (an interrupted
    export or job, for tests that check nothing is lost)."""
    for n, item in enumerate(iterable):
        if n == 1:
            raise KeyboardInterrupt
        yield item


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def ivf_lists(index) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each inverted list's (codes, ids) of a FAISS IVF index (to compare two builds list by list)."""
    import faiss

    ivf = faiss.extract_index_ivf(index)
    inv, out = ivf.invlists, []
    for i in range(ivf.nlist):
        size = inv.list_size(i)
        codes = faiss.rev_swig_ptr(inv.get_codes(i), size * inv.code_size).copy() if size else np.zeros(0, np.uint8)
        ids = faiss.rev_swig_ptr(inv.get_ids(i), size).copy() if size else np.zeros(0, np.int64)
        out.append((codes, ids))
    return out


@pytest.fixture
def small_data():
    """gallery (60, 16), query bank (200, 16), gallery bank (80, 16), queries (40, 16): unit float32."""
    rng = np.random.default_rng(1234)
    return {
        "gallery": unit_rows(rng, 60, 16),
        "query_bank": unit_rows(rng, 200, 16),
        "gallery_bank": unit_rows(rng, 80, 16),
        "queries": unit_rows(rng, 40, 16),
    }


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray for the whole session (2 CPUs, no dashboard), shut down at the end."""
    import ray  # in the test extra: a missing Ray is a failure, not a skip

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


#: The URL the Qdrant server store is tested at: no Qdrant server can be started here (none on
#: PyPI), so the client the store keeps for it is qdrant-client's own local engine in a tmp dir,
#: which serves the same client API (collections, aliases, batch queries, scroll).
QDRANT_TEST_URL = "http://qdrant-test:6333"


@pytest.fixture
def qdrant_server(tmp_path):
    """qdrant-client's local engine standing in for a Qdrant server at ``QDRANT_TEST_URL``."""
    from qdrant_client import QdrantClient

    from hubless.export import qdrant_server as store

    client = QdrantClient(path=str(tmp_path / "qdrant-server"))
    store._CLIENTS[QDRANT_TEST_URL] = client
    yield client
    store._CLIENTS.pop(QDRANT_TEST_URL, None)
    client.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """End the run by saying what was skipped and why, grouped by reason (a fresh clone skips
    what needs ../shared/data, a browser, a model's weights or a server it cannot start)."""
    from collections import Counter

    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section("skipped, and why")
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:4d} skipped: {reason}")
    terminalreporter.write_line(
        "everything else ran; the reasons say what each skipped test needs (see README.md, 'What each part needs')."
    )


#: Fixtures that start a real cluster or database server: every test using one is `slow`, so
#: the quick set (`pytest -m "not slow"`) starts neither Ray nor a database.
SERVER_FIXTURES = {"ray_local", "qdrant_server", "postgres", "store_roots"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


#: The benchmark data folders a test can need, and the command that fetches each.
SHARED_FOLDERS = {"coco_karpathy": "coco", "flickr30k_karpathy": "flickr30k", "visogender": "visogender"}


def needs_shared(*folders: str) -> pytest.MarkDecorator:
    """Mark a test that needs these folders of the benchmark data (``../shared/data/FOLDER``
    beside the checkout, or ``$HUBLESS_DATA_DIR/FOLDER``): without them it skips, saying which
    and how to get them; ``pytest -m needs_shared`` runs exactly these (.ci/run does, with the
    data beside); with ``HUBLESS_REQUIRE_SHARED=1`` a missing folder fails the test instead."""
    unknown = set(folders) - set(SHARED_FOLDERS)
    assert folders and not unknown, f"needs_shared takes folders of {sorted(SHARED_FOLDERS)}; got {sorted(unknown)}"
    return pytest.mark.needs_shared(*folders)


def pytest_runtest_setup(item):
    """Skip (or fail, with ``HUBLESS_REQUIRE_SHARED=1``) a ``needs_shared`` test whose data
    folders are missing."""
    folders = [folder for mark in item.iter_markers("needs_shared") for folder in mark.args]
    if not folders:
        return
    from hubless.data.karpathy import data_dir

    missing = [folder for folder in folders if not (data_dir() / folder).is_dir()]
    if missing:
        fetch = " and ".join(f"`hubless data fetch {SHARED_FOLDERS[f]}`" for f in missing)
        reason = f"needs ../shared/data/{', '.join(missing)} (or {fetch})"
        if os.environ.get("HUBLESS_REQUIRE_SHARED") == "1":
            pytest.fail(f"{reason}: HUBLESS_REQUIRE_SHARED=1 asks for the data (looked in {data_dir()})", pytrace=False)
        pytest.skip(reason)
