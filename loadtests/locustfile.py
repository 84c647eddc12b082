"""Load test of party B: each user is one party A training one run, step after step.

    python -m loadtests.run --users 4 --run-time 30s        # starts party B itself
    locust -f loadtests/locustfile.py --host URL --labels-csv IDS.csv --token TOKEN ...

A user creates a run with a realistic config (``loadtests.scenarios``), aligns every id of
party B's label table, then posts real msgpack steps in order (party B refuses any other
order) with the batch digest of the product's own schedule. Every response is checked with
``catch_response``: status, content type, and a gradient that decodes to the right shape
for the right step. Requests are named by route (run ids replaced by ``[id]``) plus the
scenario, so locust groups them.

The SLO gate: on ``quitting`` the process exit code becomes 1 when the failure ratio over
all requests exceeds ``--max-fail-ratio`` or the p99 of step requests exceeds
``--max-p99-ms`` (``loadtests.slo``).
"""

import functools
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

from locust import FastHttpUser, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.stats import StatsEntry

# `locust -f loadtests/locustfile.py` puts only loadtests/ on sys.path; the helpers are
# imported as the package they are, from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_schemas.problems import MSGPACK_CONTENT_TYPE  # noqa: E402
from loadtests.scenarios import (  # noqa: E402
    SCENARIOS,
    Scenario,
    StepSchedule,
    hashed_ids,
    read_ids,
)
from loadtests.slo import Totals, violations  # noqa: E402
from shared import codec  # noqa: E402

log = logging.getLogger("loadtests")
STEP_ROUTE = "/v1/runs/[id]/steps"


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _arguments(parser: Any) -> None:
    parser.add_argument("--labels-csv", help="party B's label table (its ids are aligned)")
    parser.add_argument("--token", default="loadtest-token-0123456789", help="bearer token")
    parser.add_argument("--run-steps", type=int, default=1_000_000, help="steps per run")
    parser.add_argument("--max-fail-ratio", type=float, default=0.0, help="SLO: failures")
    parser.add_argument("--max-p99-ms", type=float, default=2000.0, help="SLO: step p99")


@functools.cache
def _ids(path: str) -> list[str]:
    return read_ids(Path(path))


class _RunUser(FastHttpUser):
    """Party A of one run of ``scenario``: create, align, then steps in order."""

    abstract = True
    scenario: Scenario
    wait_time = constant(0)  # the next step goes out as soon as the last one is answered

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.headers = {"Authorization": f"Bearer {options.token}"}
        self.msgpack_headers = {**self.headers, "Content-Type": MSGPACK_CONTENT_TYPE}
        name = self.scenario.name
        spec = self.scenario.run_create(
            f"locust-{name}-{uuid.uuid4().hex[:8]}", steps=options.run_steps, seed=0
        )
        with self.client.post(
            "/v1/runs",
            json=spec.model_dump(mode="json"),
            headers=self.headers,
            name=f"/v1/runs {name}",
            catch_response=True,
        ) as response:
            if response.status_code != 201:
                response.failure(f"create run: HTTP {response.status_code}: {response.text}")
                raise StopUser()
            run = response.json()
        self.run_id = run["id"]
        hashed = hashed_ids(run["alignment_key"], _ids(options.labels_csv))
        with self.client.post(
            f"/v1/runs/{self.run_id}/alignment",
            json={"hashed_ids": hashed},
            headers=self.headers,
            name=f"/v1/runs/[id]/alignment {name}",
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"align: HTTP {response.status_code}: {response.text}")
                raise StopUser()
            intersection = response.json()["intersection"]
        self.schedule = StepSchedule(self.scenario, spec, intersection)
        _ = self.scenario.chunk  # quantize the scenario's batch now, not inside a timed step
        self.applied = 0

    @task
    def step(self) -> None:
        step = self.applied + 1
        body = self.schedule.body(step)
        with self.client.post(
            f"/v1/runs/{self.run_id}/steps",
            data=body,  # type: ignore[arg-type]  # bytes work; the stub is too narrow
            headers=self.msgpack_headers,
            name=f"{STEP_ROUTE} {self.scenario.name}",
            catch_response=True,
        ) as response:
            problem = _step_problem(response, step, self.scenario)
            if problem is not None:
                response.failure(problem)  # the same step is sent again next time
                return
            response.success()
        self.applied = step

    def on_stop(self) -> None:
        if getattr(self, "run_id", None) is None:
            return
        self.client.post(
            f"/v1/runs/{self.run_id}/finish",
            headers=self.headers,
            name=f"/v1/runs/[id]/finish {self.scenario.name}",
        )


def _step_problem(response: Any, step: int, scenario: Scenario) -> str | None:
    """Why a step response is wrong, or None when it is a good answer to ``step``."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {(response.text or '')[:200]}"
    media = (response.headers.get("content-type") or "").split(";")[0].strip()
    if media != MSGPACK_CONTENT_TYPE:
        return f"content type {media!r}, expected {MSGPACK_CONTENT_TYPE}"
    try:
        answer = codec.decode_step_response(response.content)
    except codec.CodecError as exc:
        return f"undecodable step response: {exc}"
    expected = (scenario.batch, scenario.cut_dim)
    if answer.step != step or answer.grad.shape != expected:
        return f"answer for step {answer.step} with grad {answer.grad.shape}, expected {expected}"
    return None


class FemnistFedLite(_RunUser):
    scenario = SCENARIOS["femnist-fedlite"]


class FemnistSplitFed(_RunUser):
    scenario = SCENARIOS["femnist-splitfed"]


class NwpFedLite(_RunUser):
    scenario = SCENARIOS["nwp-fedlite"]


class CreditFedLite(_RunUser):
    scenario = SCENARIOS["credit-fedlite"]


USER_CLASSES = {
    cls.scenario.name: cls for cls in (FemnistFedLite, FemnistSplitFed, NwpFedLite, CreditFedLite)
}


# ------------------------------------------------------------------------------ SLO gate


def _step_totals(environment: Environment) -> Totals:
    stats = environment.stats
    steps = StatsEntry(stats, "steps", "POST", use_response_times_cache=False)
    for entry in stats.entries.values():
        if entry.name.startswith(STEP_ROUTE):
            steps.extend(entry)
    return Totals(
        requests=stats.total.num_requests,
        failures=stats.total.num_failures,
        steps=steps.num_requests,
        p99_ms=steps.get_response_time_percentile(0.99) if steps.num_requests else 0.0,
    )


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _slo_gate(environment: Environment, **_kwargs: Any) -> None:
    options = environment.parsed_options
    assert options is not None  # set by locust's command line before any event fires
    totals = _step_totals(environment)
    problems = violations(
        totals, max_fail_ratio=options.max_fail_ratio, max_p99_ms=options.max_p99_ms
    )
    if problems:
        log.error("SLO missed: %s", "; ".join(problems))
        environment.process_exit_code = 1
    else:
        log.info(
            "SLO met: %d requests, %d failures, step p99 %.0f ms",
            totals.requests,
            totals.failures,
            totals.p99_ms,
        )
        environment.process_exit_code = 0
