"""A real headless browser for page tests: Debian's chromium, driven by playwright.

Playwright's own browser downloads are never used (``playwright install`` fetches builds from
the internet; CI installs Debian's ``chromium`` package, .ci/run). Without chromium or the
playwright package the tests skip with the reason, except under CI=true, where they fail.
"""

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",  # containers often give /dev/shm 64 MB: chromium would crash
]


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def chromium_path() -> Path:
    """Debian's chromium (FEDLITE_CHROMIUM names another build of it)."""
    named = os.environ.get("FEDLITE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    path = Path(named)
    if not path.exists():
        _unavailable(
            f"no chromium at {path}: install Debian's (apt-get install -y chromium; .ci/run "
            "does it) or set FEDLITE_CHROMIUM"
        )
    return path


def require_browser() -> Path:
    """Chromium's path, once playwright is known to be there (skip or, in CI, fail)."""
    path = chromium_path()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright package is missing: pip install -e '.[test]'")
    return path


@contextmanager
def browser_page(*, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A fresh page of a headless chromium, closed at the end of the block."""
    path = require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(path), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            yield context.new_page()
        finally:
            browser.close()


@dataclass
class PageWatch:
    """Everything that went wrong on a page: console errors, uncaught exceptions, requests
    that failed or were answered with an error, and requests to any other origin."""

    origin: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    error_responses: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    stopped: bool = False  # the test has seen what it needs: the page is about to close

    def attach(self, page: Any) -> "PageWatch":
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        page.on("requestfailed", self._failed)
        page.on("request", self._request)
        page.on("response", self._response)
        return self

    def stop(self) -> None:
        """Stop watching: closing the browser aborts the refresh the page has in flight, which
        is the test's doing, not the page's."""
        self.stopped = True

    def _failed(self, request: Any) -> None:
        if not self.stopped:
            self.failed.append(f"{request.url}: {request.failure}")

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def _request(self, request: Any) -> None:
        self.requests.append(request.url)
        parts = urlsplit(request.url)
        if parts.scheme not in ("data", "blob") and f"{parts.scheme}://{parts.netloc}" != (
            self.origin
        ):
            self.foreign.append(request.url)

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self.error_responses.append(f"{response.status} {response.url}")

    def problems(self) -> dict[str, list[str]]:
        """Every kind of trouble seen, empty lists left out."""
        found = {
            "console errors": self.console_errors,
            "page errors": self.page_errors,
            "failed requests": self.failed,
            "error responses": self.error_responses,
            "requests to other hosts": self.foreign,
        }
        return {kind: items for kind, items in found.items() if items}
