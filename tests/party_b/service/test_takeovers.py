"""A run taken over twice in a row stays behind until it applies a step again
(``party_b.store.takeovers``): the second load finds no step past the checkpoint to drop (the
first load dropped them), yet the parties are still past it, so a step ahead must not wait
out the hold for a predecessor that never comes. Once a checkpoint reaches the steps that
were lost, a load is not behind and steps ahead are held as usual.

Real uvicorn over real HTTP with one worker thread, as ``test_held_steps``; a takeover is the
run leaving memory (``cache.drop``) and being loaded again from the database, which claims its
lease anew, as another replica's load would. Whether a step was held is read from party B's
``fedlite_b_steps_total{outcome="held"}``, never from the clock.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.live import live_server
from tests.utils.small_runs import MSGPACK, TOKEN, SmallRun, aligned_run, labels_csv, problem

LONG = 60.0  # the hold: a step refused at once never waits it out


@contextmanager
def _party_b(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN}",
        worker_threads=1,
        privacy="off",
        step_hold_seconds=LONG,
    )
    app = create_app(settings)
    with live_server(app) as url:
        yield app, url


def _post_step(url: str, run: SmallRun, step: int) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        return client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK)


def _held(app: FastAPI) -> float:
    value = app.state.metrics.registry.get_sample_value(
        "fedlite_b_steps_total", {"outcome": "held"}
    )
    return float(value or 0.0)


def _take_over(app: FastAPI, run: SmallRun) -> None:
    app.state.service.context.cache.drop(run.id)  # the next request loads it from the store


def test_a_second_takeover_before_any_step_still_refuses_steps_ahead_at_once(
    tmp_path: Path,
) -> None:
    with _party_b(tmp_path) as (app, url):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            run = aligned_run(client)  # checkpoints every 2 steps
        for step in (1, 2, 3):
            assert _post_step(url, run, step).status_code == 200
        held = _held(app)

        # Execute: a takeover drops step 3 (past checkpoint 2), then another before any step
        _take_over(app, run)
        first = _post_step(url, run, 5)  # party A's next steps after 3 (K = 2)
        _take_over(app, run)
        second = _post_step(url, run, 5)

        # Assert: both refused at once, neither held
        for refused in (first, second):
            assert problem(refused, 409, "step-out-of-order")["applied_step"] == 2
        assert _held(app) == held


def test_a_load_at_a_checkpoint_past_the_lost_steps_holds_steps_ahead_again(
    tmp_path: Path,
) -> None:
    with _party_b(tmp_path) as (app, url):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            run = aligned_run(client)
        for step in (1, 2, 3):
            assert _post_step(url, run, step).status_code == 200
        _take_over(app, run)  # step 3 lost: behind
        assert _post_step(url, run, 5).status_code == 409
        for step in (3, 4):  # replayed; step 4 is checkpointed, past the lost step 3
            assert _post_step(url, run, step).status_code == 200
        held = _held(app)

        # Execute: a takeover at checkpoint 4, then step 6 before step 5
        _take_over(app, run)
        late: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: late.append(_post_step(url, run, 6)))
        sender.start()
        deadline = time.monotonic() + 60
        while _held(app) == held:  # poll until party B holds step 6
            assert time.monotonic() < deadline, "step 6 was never held"
            time.sleep(0.01)
        on_time = _post_step(url, run, 5)
        sender.join(timeout=120)

        # Assert: step 6 waited for step 5, and both were applied
        assert on_time.status_code == 200
        assert late and late[0].status_code == 200
