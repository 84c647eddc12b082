"""Party B's operator dashboard in a real headless browser (Debian's chromium, playwright).

The first test runs ``fedlite-b serve`` with the dashboard on, trains a real run from party
A over HTTP, and watches the page draw the loss curve further while the run trains; with
FEDLITE_UPDATE_FIGURES=1 its screenshot replaces docs/figures/dashboard.png (a test run
otherwise leaves the checkout as it was). The second refuses a party A token and a wrong
credential in the page. Without chromium they skip, except under CI=true (tests/utils/browser.py).
"""

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from party_a.bottom import StepResult
from party_a.trainer import PartyATrainer
from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.browser import PageWatch, browser_page, require_browser
from tests.utils.data import breast_pair
from tests.utils.live import live_server
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.servers import ALICE, breast_party_b
from tests.utils.small_runs import labels_csv

OPERATOR = "operator-credential-0123456789abcdef"
PARTY_A = "alice-token-0123456789abcdef"  # long enough for the sign-in form to send it
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "figures" / "dashboard.png"
STEPS = 240


@pytest.fixture(autouse=True)
def _browser() -> None:
    """Skip (or fail, in CI) before starting any server when there is no browser."""
    require_browser()


def _sign_in(page: Any, url: str, credential: str) -> None:
    page.goto(f"{url}/dashboard/?every=0.5")
    page.fill("#credential", credential)
    page.click("#login-form button[type=submit]")


def _chart_and_badge(page: Any, run_id: str) -> tuple[int, str]:
    """The loss chart's last step and the run's state in the runs table, read at once."""
    found = page.evaluate(
        """(id) => [document.getElementById("chart-loss").dataset.lastStep || "0",
                    document.querySelector(`#runs tr[data-run-id="${id}"] .badge`)?.textContent]""",
        run_id,
    )
    return int(float(found[0])), str(found[1])


def _wait_for(check: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def trained(tmp_path: Path) -> Iterator[tuple[str, PartyATrainer]]:
    """Party B serving with the dashboard on, and a party A session on the breast data."""
    env = {"FEDLITE_B_DASHBOARD_TOKEN": OPERATOR}
    with breast_party_b(tmp_path / "party_b", {"alice": ALICE}, env=env) as server:
        _guest, host = breast_pair()
        config = breast_config("breast-dashboard", **{"run.steps": STEPS})
        trainer = make_trainer(tmp_path / "party_a", server.url, ALICE, host, config)
        try:
            yield server.url, trainer
        finally:
            trainer.close()


def test_the_dashboard_draws_a_training_run_as_it_trains(
    trained: tuple[str, PartyATrainer], tmp_path: Path
) -> None:
    url, trainer = trained
    screenshot = tmp_path / "dashboard.png"
    run_id = trainer.prepare().id
    # the run waits at step 10 until the page has drawn a first curve, and at step 60 until
    # it has drawn more: the page sees it in training whatever the machine's load
    seen_first, seen_more = threading.Event(), threading.Event()
    gates = {10: seen_first, 60: seen_more}

    def gated(result: StepResult, _summary: object) -> None:
        if result.step in gates:
            gates[result.step].wait(timeout=240)

    trainer.on_step = gated
    training = threading.Thread(target=trainer.train)
    with browser_page() as page:
        watch = PageWatch(origin=url).attach(page)
        _sign_in(page, url, OPERATOR)
        page.wait_for_selector(f'#runs tr[data-run-id="{run_id}"]')
        training.start()
        try:
            first, state = _wait_for(
                lambda: (s := _chart_and_badge(page, run_id))[0] >= 5 and s, "a first curve"
            )
            seen_first.set()
            later, later_state = _wait_for(
                lambda: (s := _chart_and_badge(page, run_id))[0] > first + 20 and s, "more steps"
            )
        finally:
            seen_first.set()
            seen_more.set()
            training.join(timeout=300)
        trainer.evaluate("train")
        trainer.evaluate("eval")
        trainer.finish()
        _wait_for(
            lambda: (
                _chart_and_badge(page, run_id) == (STEPS, "finished")
                and page.locator("#evaluations tbody tr").count() == 2
            ),
            "the finished run with its evaluations",
        )
        title, cards = page.inner_text("#run-title"), page.inner_text("#run-cards")
        page.screenshot(path=str(screenshot), full_page=True)
        watch.stop()

    # the curve grew while the run was in training, before its last step
    assert first < later < STEPS and state == later_state == "training"
    assert title == f"Run breast-dashboard ({run_id}) of alice"
    assert "COMPRESSION" in cards and "×" in cards  # labels are upper case (CSS)
    assert watch.problems() == {}, watch.problems()
    assert any("/dashboard/api/runs/" in r for r in watch.requests)
    assert 20_000 < screenshot.stat().st_size < 400_000
    if os.environ.get("FEDLITE_UPDATE_FIGURES") == "1":
        shutil.copyfile(screenshot, SCREENSHOT)


def test_the_dashboard_refuses_a_party_a_token_and_a_wrong_credential(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"alice:{PARTY_A}",
        dashboard_token=OPERATOR,
    )
    with live_server(create_app(settings)) as url, browser_page() as page:
        httpx.post(
            f"{url}/v1/runs",
            json={"name": "visible-after-sign-in", **_small_run()},
            headers={"Authorization": f"Bearer {PARTY_A}"},
        ).raise_for_status()
        watch = PageWatch(origin=url).attach(page)
        refused = []
        for wrong in (PARTY_A, OPERATOR[:-1] + "X"):
            _sign_in(page, url, wrong)
            page.wait_for_selector("#login-error:has-text('Refused')")
            refused.append(page.is_visible("#board"))
        assert watch.error_responses == [f"401 {url}/dashboard/api/overview"] * 2
        assert page.locator("#runs tbody tr").count() == 0  # nothing was drawn
        watch.error_responses.clear()
        watch.console_errors.clear()  # chromium logs each refused request as one

        _sign_in(page, url, OPERATOR)
        page.wait_for_selector("#runs tbody tr")
        shown = page.inner_text("#runs")
        watch.stop()

    assert refused == [False, False]
    assert "visible-after-sign-in" in shown and "alice" in shown
    assert watch.problems() == {}, watch.problems()


def _small_run() -> dict[str, Any]:
    return {
        "model": "tabular_mlp",
        "cut_dim": 8,
        "quantizer": {"mode": "pq", "q": 4, "L": 2},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "batch_size": 8,
        "steps": 10,
        "seed": 0,
    }
