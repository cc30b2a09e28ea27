"""The web page in a real browser (Debian's Chromium driven by Playwright): search by item id,
corrected and uncorrected results side by side with rank-change marks, the weight slider
re-queries, a click searches by the result, the hubness panel plots N1 before/after. A
screenshot is saved (tests' artifacts) and the layout is checked for visible, non-overlapping
parts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
playwright = pytest.importorskip("playwright.sync_api")

import hubless  # noqa: E402
from hubless.data.synthetic import make_retrieval_data  # noqa: E402
from tests.test_service import _free_port  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("HUBLESS_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / ".artifacts"))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    data = make_retrieval_data(n_items=300, dim=32, n_query_bank=2000, n_val_items=10, seed=4)
    meta = [{"caption": f"photo number {i} of topic {i % 25}"} for i in range(300)]
    hubless.Index.build(data.gallery, data.query_bank, "nnn:alpha=0.75,k=16", "Flat", metadata=meta).save(root / "demo")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hubless", "serve", str(root / "demo"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/health", timeout=1).read()
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=20)


def _box(page, selector):
    box = page.locator(selector).bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0, f"{selector} is not visible"
    return box


def _overlap(a, b) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
    )


def test_the_page_in_chromium(server):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1366, "height": 900})  # a laptop screen
        requests = []
        page.on("request", lambda r: requests.append(r.url) if r.url.endswith("/search") else None)
        page.goto(server + "/")
        page.fill("#query", "7")
        page.press("#query", "Enter")
        page.wait_for_selector("#corrected .card")
        assert page.locator("#corrected .card").count() == 12 and page.locator("#uncorrected .card").count() == 12
        assert "nnn:alpha=0.75,k=16" in page.inner_text("#corrected-title")
        marks = page.locator("#corrected .up, #corrected .down, #corrected .new").count()
        assert marks > 0  # the correction moved something, and the page shows it
        first = page.locator("#uncorrected .card").first.inner_text()
        assert "id 7" in first and "photo number 7" in first  # uncorrected: the item is its own nearest
        # the weight slider re-queries, live
        before = len(requests)
        page.locator("#weight").fill("0")
        page.locator("#weight").dispatch_event("change")
        page.wait_for_function("document.querySelectorAll('#corrected .up, #corrected .down, #corrected .new').length === 0")
        assert len(requests) > before and page.inner_text("#weight-value") == "0.00"
        # a click on a result searches by it
        target = page.locator("#corrected .card").nth(3)
        clicked = target.get_attribute("data-id")
        target.click()
        page.wait_for_function(f"document.querySelector('#query').value === '{clicked}'")
        page.wait_for_function(f"document.querySelector('#uncorrected .card').dataset.id === '{clicked}'")
        # the hubness panel
        page.click("#show-hubness")
        page.wait_for_selector("#hubness-plot rect.before")
        assert page.locator("#hubness-plot rect.before").count() == 10 and page.locator("#hubness-plot rect.after").count() == 10
        assert "skewness" in page.inner_text("#hubness-stats")
        # errors are shown, not thrown
        page.fill("#query", "a text query")
        page.press("#query", "Enter")
        page.wait_for_selector("#message.error")
        assert "model" in page.inner_text("#message")
        # layout: the parts are visible and do not overlap
        header, corrected, uncorrected, hubness = (_box(page, s) for s in ("header", "#corrected", "#uncorrected", "#hubness"))
        assert not _overlap(corrected, uncorrected) and not _overlap(header, corrected) and not _overlap(corrected, hubness)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.fill("#query", "7")
        page.locator("#weight").fill("0.75")
        page.locator("#weight").dispatch_event("change")
        page.wait_for_selector("#corrected .up, #corrected .down, #corrected .new")
        page.screenshot(path=str(ARTIFACTS / "service-page.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "service-page.png").stat().st_size > 10_000
