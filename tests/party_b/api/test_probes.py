"""Party B's probes and its steps-in-flight gauge, over real HTTP (uvicorn in a thread).

* ``/readyz`` is 200 on a party B that serves and answers 503 problem+json ``unavailable``
  with ``Retry-After`` while its PostgreSQL is unreachable (a relay in front of a real server,
  cut and restored), and is ready again once the database is back; ``/healthz`` (liveness)
  stays 200 all along.
* ``fedlite_b_steps_in_flight`` counts a step while party B handles it (one held for its
  turn), and is 0 again once it has its answer.

The SIGTERM drain with a real process and a training party A is tests/e2e/test_drain.py.
"""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import make_url

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.databases import fresh_database
from tests.utils.live import live_server
from tests.utils.relay import TcpRelay
from tests.utils.servers import free_port
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv, problem


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"tester:{TOKEN}",
        **overrides,
    )


def _gauge(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("fedlite_b_steps_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no fedlite_b_steps_in_flight on /metrics")


def _eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def relayed_postgres(tmp_path: Path) -> Iterator[tuple[str, TcpRelay]]:
    """A fresh PostgreSQL database, reached through a relay the test can cut."""
    with fresh_database("postgresql", tmp_path) as url:
        parsed = make_url(url)
        relay = TcpRelay(parsed.host or "127.0.0.1", parsed.port or 5432).start()
        try:
            through = parsed.set(host="127.0.0.1", port=relay.port)
            yield through.render_as_string(hide_password=False), relay
        finally:
            relay.cut()


def test_a_serving_party_b_is_ready_and_live(tmp_path: Path) -> None:
    with live_server(create_app(_settings(tmp_path))) as url:
        ready = httpx.get(f"{url}/readyz")
        live = httpx.get(f"{url}/healthz")
        gauge = _gauge(url)

    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert gauge == 0


def test_a_party_b_whose_start_up_never_ran_is_live_but_not_ready(tmp_path: Path) -> None:
    """Served without its lifespan (uvicorn's --lifespan off), nothing marks party B started:
    /readyz keeps saying so, while /healthz answers."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(_settings(tmp_path)), port=port, lifespan="off", log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _eventually(lambda: server.started, "uvicorn")
    try:
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        live = httpx.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        server.should_exit = True
        thread.join(timeout=10)

    assert problem(ready, 503, "unavailable")["detail"] == "party B is starting"
    assert live.status_code == 200


def test_readiness_follows_the_database_and_liveness_does_not(
    tmp_path: Path, relayed_postgres: tuple[str, TcpRelay]
) -> None:
    database_url, relay = relayed_postgres
    with live_server(create_app(_settings(tmp_path, database_url=database_url))) as url:
        _eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200, "ready first")
        before = httpx.get(f"{url}/readyz")
        time.sleep(1.1)  # past the probe's reuse of a fresh result
        relay.cut()
        unready = httpx.get(f"{url}/readyz")
        live_meanwhile = httpx.get(f"{url}/healthz")
        relay.restore()
        _eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200, "ready again")
        runs = httpx.get(f"{url}/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"})

    assert before.status_code == 200
    body = problem(unready, 503, "unavailable")
    assert "database" in body["detail"] and "127.0.0.1" not in body["detail"]
    assert unready.headers["Retry-After"] == "5"
    assert live_meanwhile.status_code == 200
    assert runs.status_code == 200  # and the API works again with it


def test_the_gauge_counts_a_step_while_party_b_handles_it(tmp_path: Path) -> None:
    """Step 3 of a run at step 0 waits for its turn (party_b/service/meetings.py): in flight
    all that time; once steps 1 and 2 come it is applied, and the gauge is back at 0."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with (
        live_server(create_app(_settings(tmp_path, step_hold_seconds=60.0))) as url,
        httpx.Client(base_url=url, headers=auth, timeout=60) as client,
    ):
        run = aligned_run(client)
        answer: list[httpx.Response] = []
        held = threading.Thread(
            target=lambda: answer.append(
                client.post(f"/v1/runs/{run.id}/steps", content=run.step_body(3), headers=MSGPACK)
            )
        )
        held.start()
        _eventually(lambda: _gauge(url) == 1, "the held step on the gauge")
        for step in (1, 2):  # its predecessors: it goes in its turn
            sent = client.post(
                f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
            )
            assert sent.status_code == 200, sent.text
        held.join(timeout=60)
        after = _gauge(url)

    assert answer[0].status_code == 200, answer[0].text
    assert after == 0
