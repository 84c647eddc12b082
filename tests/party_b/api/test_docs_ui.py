"""``/docs`` renders in a real headless browser with nothing but party B to talk to.

Swagger UI used to load from a CDN: without internet access the page was blank. Here every
request the page makes must go to party B itself and succeed, and the page must show every
operation of the OpenAPI document. Without chromium the test skips, except under CI=true
(tests/utils/browser.py).
"""

from pathlib import Path

import httpx

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.browser import PageWatch, browser_page, require_browser
from tests.utils.live import live_server
from tests.utils.small_runs import TOKEN, labels_csv


def test_docs_render_every_operation_from_local_files(tmp_path: Path) -> None:
    require_browser()  # skip (or fail in CI) before starting a server
    settings = Settings(
        data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "l.csv"), tokens=f"t:{TOKEN}"
    )
    with live_server(create_app(settings)) as url, browser_page() as page:
        document = httpx.get(f"{url}/openapi.json", timeout=60).json()
        expected = {
            f"{method.upper()} {path}"
            for path, item in document["paths"].items()
            for method in item
        }
        watch = PageWatch(origin=url).attach(page)
        page.goto(f"{url}/docs")
        page.wait_for_selector(".opblock-summary", timeout=60_000)
        page.wait_for_load_state("networkidle")
        shown = page.evaluate(
            """() => [...document.querySelectorAll(".opblock-summary")].map(
                   s => s.querySelector(".opblock-summary-method").textContent.trim() + " "
                        + s.querySelector(".opblock-summary-path").dataset.path)"""
        )
        authorize = page.locator("button.authorize").count()
        watch.stop()
    assert watch.problems() == {}, watch.problems()
    assert set(shown) == expected, sorted(set(shown) ^ expected)
    assert authorize == 1  # the bearer scheme is there to fill in
    assert any(r.endswith("/docs/assets/swagger-ui-bundle.js") for r in watch.requests)


def test_docs_assets_are_party_bs_own(party_b_client: httpx.Client) -> None:
    c = party_b_client
    html = c.get("/docs").text
    assert "cdn" not in html.lower() and "https://" not in html, html
    script = c.get("/docs/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 500_000
    assert script.headers["content-type"].startswith("text/javascript")
    missing = c.get("/docs/assets/nothing.js")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert c.get("/redoc").status_code == 404
