"""The web page in a real browser (Debian's Chromium driven by Playwright) against a real
`hubless serve`: search by item id, corrected and uncorrected results side by side with
rank-change marks, the weight slider re-queries, a chosen result searches by itself, the
hubness panel plots N1 before/after and shows the served hubness; stale answers are dropped
(the first answer held back until a newer search has shown), an error clears old results,
search and result choice by keyboard only with a visible focus, no horizontal scroll at
400 px, screenshots at 400 and 1280 px kept in .artifacts/, an axe-core scan without serious or
critical violations, no CSP violation, the API-key field, thumbnails from --image-root, a
favicon, and /docs rendering offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
playwright = pytest.importorskip("playwright.sync_api")

import hubless  # noqa: E402
from hubless.data.synthetic import make_retrieval_data  # noqa: E402
from tests.service.test_service import _free_port  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("HUBLESS_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".artifacts"))
SRC = str(Path(__file__).resolve().parents[2] / "src")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")]
KEY = "page-test-key-0123456789"


def start(args, tmp) -> tuple[str, subprocess.Popen]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "hubless", "serve", *args, "--port", str(port)], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):  # bounded wait for start-up
        try:
            urllib.request.urlopen(base + "/health", timeout=1).read()
            return base, proc
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the server did not start: {proc.stdout.read()}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("page")
    data = make_retrieval_data(n_items=300, dim=32, n_query_bank=2000, n_val_items=10, seed=4)
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        Image.fromarray((rng.random((24, 24, 3)) * 255).astype(np.uint8)).save(images / f"{i}.png")
    meta = [{"caption": f"photo number {i} of topic {i % 25}", "topic": i % 25, "path": f"{i % 12}.png"} for i in range(300)]
    hubless.Index.build(data.gallery, data.query_bank, "nnn:alpha=0.75,k=16", "Flat", metadata=meta).save(root / "demo")
    (root / "key").write_text(KEY)
    plain, p1 = start([str(root / "demo"), "--image-root", str(images)], root)
    keyed, p2 = start([str(root / "demo"), "--api-key-file", str(root / "key")], root)
    yield {"plain": plain, "keyed": keyed}
    for p in (p1, p2):
        p.terminate()
        p.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def watch_csp(page) -> list[str]:
    problems = []
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text or "Refused to" in m.text else None)
    return problems


def _box(page, selector):
    box = page.locator(selector).bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0, f"{selector} is not visible"
    return box


def _overlap(a, b) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
    )


def test_the_page_in_chromium(servers, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    csp = watch_csp(page)
    requests = []
    page.on("request", lambda r: requests.append(r) if r.url.endswith("/search") else None)
    page.goto(servers["plain"] + "/")
    page.wait_for_selector("#index option", state="attached")
    # an index without a model is searched by item id only: the page says so (not "by text")
    page.wait_for_function("() => document.querySelector('#message').textContent.startsWith('Search by')")
    assert page.inner_text("#message") == "Search by an item id; choose a result to search with it."
    assert page.get_attribute("#query", "placeholder") == "an item id such as 42"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-no-model.png"))
    page.fill("#query", "7")
    page.press("#query", "Enter")
    page.wait_for_selector("#corrected .card")
    assert page.locator("#corrected .card").count() == 12 and page.locator("#uncorrected .card").count() == 12
    assert "nnn:alpha=0.75,k=16" in page.inner_text("#corrected-title")
    assert "NNN's score" in page.inner_text("#scales") and "cosine similarities" in page.inner_text("#scales")
    assert page.locator("#corrected .up, #corrected .down, #corrected .new").count() > 0
    first = page.locator("#uncorrected .card").first.inner_text()
    assert "id 7" in first and "photo number 7" in first  # uncorrected: the item is its own nearest
    page.wait_for_function("() => [...document.querySelectorAll('#corrected img.thumb')].some((i) => i.complete && i.naturalWidth === 24)")
    # compare is sent only when its toggle is on
    page.uncheck("#compare")
    page.wait_for_function("() => document.querySelector('#uncorrected-column').hidden")
    assert "compare" not in (requests[-1].post_data or "")
    page.check("#compare")
    page.wait_for_selector("#uncorrected .card")
    assert '"compare":true' in requests[-1].post_data
    # the weight slider re-queries, live
    before = len(requests)
    page.locator("#weight").fill("0")
    page.locator("#weight").dispatch_event("change")
    page.wait_for_function("() => document.querySelectorAll('#corrected .up, #corrected .down, #corrected .new').length === 0")
    assert len(requests) > before and page.inner_text("#weight-value") == "0.00"
    # choosing a result searches by it
    target = page.locator("#corrected .card").nth(3)
    chosen = target.get_attribute("data-id")
    target.click()
    page.wait_for_function(f"() => document.querySelector('#query').value === '{chosen}'")
    page.wait_for_function(f"() => document.querySelector('#uncorrected .card').dataset.id === '{chosen}'")
    # "More results" asks for the next top_k
    page.click("#more")
    page.wait_for_function("() => document.querySelectorAll('#corrected .card').length === 24")
    # the hubness panel: bank figures and what was served
    page.click("#show-hubness")
    page.wait_for_selector("#hubness-plot rect.before")
    assert page.locator("#hubness-plot rect.before").count() == 10 and page.locator("#hubness-plot rect.after").count() == 10
    assert "skewness" in page.inner_text("#hubness-stats") and "queries served" in page.inner_text("#served-stats")
    # an error is shown inline and the old results go
    page.fill("#query", "a text query")
    page.press("#query", "Enter")
    page.wait_for_selector("#message.error")
    assert "no text queries" in page.inner_text("#message") and page.locator("#corrected .card").count() == 0
    page.fill("#where", "{not json")
    page.fill("#query", "7")
    page.press("#query", "Enter")
    page.wait_for_function("() => document.querySelector('#message').textContent.includes('JSON')")
    page.fill("#where", "")
    # layout at a laptop width: the parts are visible and do not overlap
    page.fill("#query", "7")
    page.locator("#weight").fill("0.75")
    page.locator("#weight").dispatch_event("change")
    page.wait_for_selector("#corrected .up, #corrected .down, #corrected .new")
    header, corrected, uncorrected, hubness = (_box(page, s) for s in ("header", "#corrected", "#uncorrected", "#hubness"))
    assert not _overlap(corrected, uncorrected) and not _overlap(header, corrected) and not _overlap(corrected, hubness)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "service-page-1280.png"), full_page=True)
    # a phone width: no horizontal scroll, the plot fits
    page.set_viewport_size({"width": 400, "height": 800})
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    assert _box(page, "#hubness-plot")["width"] <= 400
    page.screenshot(path=str(ARTIFACTS / "service-page-400.png"), full_page=True)
    assert not csp, csp
    page.close()


def test_stale_answers_are_dropped(servers, browser):
    """The first search's answer is held back until a second search has shown its results;
    when it finally arrives it must not replace them."""
    page = browser.new_page()
    held = []

    def hold_first(route):
        if not held:
            held.append(route)  # answered later, out of order
        else:
            route.continue_()

    page.route("**/search", hold_first)
    page.goto(servers["plain"] + "/")
    page.wait_for_selector("#index option", state="attached")
    page.fill("#query", "5")
    page.press("#query", "Enter")
    page.wait_for_function("() => document.querySelector('#message').textContent.startsWith('Searching')")
    page.fill("#query", "9")
    page.press("#query", "Enter")
    page.wait_for_function(
        "() => document.querySelector('#uncorrected .card') && document.querySelector('#uncorrected .card').dataset.id === '9'"
    )
    try:
        held[0].continue_()  # the stale answer comes now
    except Exception:  # noqa: BLE001 - the page aborted it already: that is dropping it too
        pass
    page.wait_for_timeout(500)
    assert page.locator("#uncorrected .card").first.get_attribute("data-id") == "9"
    assert page.locator("#message.error").count() == 0
    page.close()


def test_keyboard_only(servers, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(servers["plain"] + "/")
    page.wait_for_selector("#index option", state="attached")
    for _ in range(10):  # bounded: Tab to the query field
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "query":
            break
    assert page.evaluate("document.activeElement.id") == "query"
    page.keyboard.type("11")
    page.keyboard.press("Enter")
    page.wait_for_selector("#corrected .card")
    for _ in range(40):  # Tab on to the first result
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('card')"):
            break
    focused = page.evaluate("document.activeElement.dataset.id")
    assert focused is not None
    outline = page.evaluate(
        "getComputedStyle(document.activeElement).outlineStyle + ' ' + getComputedStyle(document.activeElement).outlineWidth"
    )
    assert not outline.startswith("none") and outline.split()[1] != "0px", outline  # a visible focus
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => document.querySelector('#query').value === '{focused}'")
    page.wait_for_function(f"() => document.querySelector('#uncorrected .card').dataset.id === '{focused}'")
    page.close()


def test_no_serious_accessibility_violation(servers, browser):
    from axe_playwright_python.sync_playwright import Axe

    context = browser.new_context(bypass_csp=True)  # axe is injected as a script
    page = context.new_page()
    page.goto(servers["plain"] + "/")
    page.wait_for_selector("#index option", state="attached")
    page.fill("#query", "7")
    page.press("#query", "Enter")
    page.wait_for_selector("#corrected .card")
    page.click("#show-hubness")
    page.wait_for_selector("#hubness-plot rect.before")
    results = Axe().run(page)
    bad = [(v["id"], v["impact"], v["help"]) for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, bad
    context.close()


def test_the_key_field_and_the_docs_offline(servers, browser):
    page = browser.new_page()
    csp = watch_csp(page)
    page.goto(servers["keyed"] + "/")
    page.wait_for_selector("#key-label:not([hidden])")
    assert "API key" in page.inner_text("#message")
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#index option", state="attached")
    page.fill("#query", "3")
    page.press("#query", "Enter")
    page.wait_for_selector("#corrected .card")
    assert page.evaluate("sessionStorage.getItem('hubless-api-key')") == KEY
    # /docs with every request off this machine blocked: it renders from the bundled assets
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1") else route.abort())
    page.goto(servers["keyed"] + "/docs")
    page.wait_for_selector("#swagger-ui .info .title", timeout=20_000)
    assert "hubless" in page.inner_text("#swagger-ui .info .title")
    page.goto(servers["keyed"] + "/redoc")
    page.wait_for_selector("redoc h1, [role=navigation]", timeout=20_000)
    assert not [c for c in csp if "script" in c], csp
    icon = urllib.request.urlopen(servers["keyed"] + "/favicon.ico", timeout=5)
    assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml"
    page.close()


def test_swagger_authorize_and_redoc_without_console_errors(servers, browser):
    """Swagger UI's Authorize button takes the key (the OpenAPI schema declares the Bearer
    scheme) and "Try it out" then reads a keyed endpoint; ReDoc renders with no console error
    (its logo came from a CDN the CSP blocks) and nothing is fetched off this machine."""
    page = browser.new_page()
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith(("http://127.0.0.1", "data:"))
            else (outside.append(route.request.url), route.abort())
        ),
    )
    page.goto(servers["keyed"] + "/docs")
    page.click("button.authorize", timeout=20_000)
    page.fill(".modal-ux input", KEY)
    page.click(".modal-ux button.authorize")
    page.click(".modal-ux button.btn-done, .modal-ux button.close-modal")
    operation = "#operations-default-list_indexes_indexes_get"
    page.click(f"{operation} .opblock-summary")
    page.click(f"{operation} button.try-out__btn")
    page.click(f"{operation} button.execute")
    status = page.wait_for_selector(f"{operation} .live-responses-table tr.response .response-col_status", timeout=20_000)
    assert status.inner_text().strip().startswith("200"), status.inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-authorized.png"), full_page=True)
    page.goto(servers["keyed"] + "/redoc")
    page.wait_for_selector("redoc h1, [role=navigation]", timeout=20_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "redoc.png"))
    assert not errors and not outside, (errors, outside)
    page.close()


def test_query_by_image_upload(tmp_path, browser):
    """With an image encoder (the index's recorded model, a tiny CLIP), the page offers an
    image upload, and its answer equals the in-process search of that image."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from hubless.encoders import load_encoder
    from tests.models import random_images, save_tiny

    model = save_tiny("clip", tmp_path / "clip")
    encoder = load_encoder(model, device="cpu")
    images = random_images(30)
    rng = np.random.default_rng(2)
    bank = encoder.encode_texts([" ".join(rng.choice(["a", "dog", "cat", "red", "car", "on", "grass"], 4)) for _ in range(60)])
    index = hubless.Index.build(encoder.encode_images(images), bank, "nnn:alpha=0.5,k=4", "Flat",
                                metadata=[{"caption": f"picture {i}"} for i in range(30)], model=str(model))  # fmt: skip
    index.save(tmp_path / "idx")
    images[5].save(tmp_path / "query.png")
    base, proc = start([str(tmp_path / "idx")], tmp_path)
    try:
        page = browser.new_page()
        page.goto(base + "/")
        page.wait_for_selector("#image-label:not([hidden])")
        assert page.inner_text("#message") == "Search by text, an image or an item id; choose a result to search with it."
        page.set_input_files("#image", str(tmp_path / "query.png"))
        page.wait_for_selector("#corrected .card")
        expected = index.search(encoder.encode_images([tmp_path / "query.png"]), 12)[1][0]
        shown = [int(x) for x in page.locator("#corrected .card").evaluate_all("(cards) => cards.map((c) => c.dataset.id)")]
        assert shown == expected.tolist()
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A server learning its bank (--learn-bank) from real searches of 30 clients (a trusted
    proxy's forwarded addresses): two refits kept, then one rejected (queries aimed at one item)."""
    import json

    root = tmp_path_factory.mktemp("learned")
    data = make_retrieval_data(n_items=300, dim=32, n_query_bank=3000, n_val_items=10, seed=4)
    far = make_retrieval_data(n_items=100, dim=32, n_query_bank=500, n_val_items=10, seed=9).query_bank
    hubless.Index.build(data.gallery, far, "nnn:alpha=0.75,k=16", "Flat").save(root / "demo")
    base, proc = start(
        [
            str(root / "demo"),
            "--learn-bank",
            "demo",
            "--trusted-proxy",
            "127.0.0.1",
            "--rate-limit",
            "0",
            "--learn-bank-every",
            "400",
            "--learn-bank-capacity",
            "1200",
            "--learn-bank-holdout",
            "0.2",
        ],
        root,
    )

    def send(rows, client):
        body = json.dumps({"embeddings": rows.tolist(), "top_k": 5}).encode()
        req = urllib.request.Request(base + "/search", data=body, headers={"content-type": "application/json", "X-Forwarded-For": client})
        urllib.request.urlopen(req, timeout=30).read()

    def decisions(n):
        for _ in range(300):  # bounded wait for the background refits
            history = json.loads(urllib.request.urlopen(base + "/hubness/demo", timeout=30).read())["learning"]["history"]
            if len(history) >= n:
                return history
            time.sleep(0.2)
        pytest.fail(f"fewer than {n} refits")

    rng = np.random.default_rng(1)
    for stage, rows in enumerate((data.query_bank[:600], data.query_bank[600:1200])):
        for i in range(0, 600, 10):
            send(rows[i : i + 10], f"198.51.100.{i // 10 % 30}")
        decisions(stage + 1)
    aimed = data.gallery[17] + 0.3 * rng.standard_normal((600, 32)).astype(np.float32) / np.sqrt(32)
    for i in range(0, 600, 10):  # 30 clients, each within its quota, all aiming at item 17
        send(aimed[i : i + 10] / np.linalg.norm(aimed[i : i + 10], axis=1, keepdims=True), f"203.0.113.{i // 10 % 30}")
    history = decisions(3)
    yield base, history
    proc.terminate()
    proc.wait(timeout=20)


def test_the_learned_bank_over_time_in_chromium(learned, browser):
    from axe_playwright_python.sync_playwright import Axe

    base, history = learned
    assert [h["decision"] for h in history[:3]] == ["accepted", "accepted", "rejected"], [h["reasons"] for h in history]
    assert "item 17" in " ".join(history[2]["reasons"])
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, bypass_csp=True)  # axe is injected as a script
    page = context.new_page()
    page.goto(base + "/")
    page.wait_for_selector("#index option", state="attached")
    page.click("#show-hubness")
    page.wait_for_selector("#learning-plot circle")
    assert page.locator("#learning-plot circle.accepted").count() == 2 and page.locator("#learning-plot circle.rejected").count() == 1
    assert page.locator("#learning-table tr").count() == 1 + len(history)
    assert "rejected" in page.inner_text("#learning-table") and "item 17" in page.inner_text("#learning-table")
    assert "from 30 clients" in page.inner_text("#learning-stats") or "clients" in page.inner_text("#learning-stats")
    page.locator("#learning").scroll_into_view_if_needed()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-learned-bank.png"), full_page=True)
    results = Axe().run(page)
    bad = [(v["id"], v["impact"], v["help"]) for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, bad
    page.set_viewport_size({"width": 400, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")  # no horizontal scroll at 400 px
    page.screenshot(path=str(ARTIFACTS / "page-learned-bank-400.png"), full_page=True)
    context.close()
