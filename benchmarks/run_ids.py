"""What response timing tells a token about run ids it does not own.

Party B runs as ``fedlite-b serve`` on 127.0.0.1 with two tokens. The owner creates two
runs of the FEMNIST FedLite scenario, aligns both and trains one step of the first, so that
one run is in party B's memory and one is only in its database. The stranger then sends
valid step and evaluate bodies, interleaved in a random order, to the loaded run, the
unloaded run and random ids that name no run, timing each request on its client
(keep-alive). Every answer must be the same 404.

Per route and target it reports the median and quartiles, and how well one request tells a
run from no run: the accuracy of the best threshold on the latency (0.5 = no information;
the outside test that found the leak measured 0.68), next to the same estimate between two
halves of the unknown ids (above 0.5 by chance alone: the best of many thresholds).

``--in-process`` times the same calls on ``Service`` in this process instead (the path
through party B without HTTP and its noise: what a difference in the path costs).

    python -m benchmarks.run_ids [--requests 400] [--in-process] [--server-root DIR]

``--server-root`` runs the party B of another checkout (e.g. an export of main) to measure
it the same way over HTTP. The script imports party B only inside its functions (and uses
only ``Service``'s constructor, ``create_run``, ``align``, ``step`` and ``evaluate``), so
a copy of it runs in an older checkout as well.
"""

import argparse
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import versions, write_result
from loadtests.scenarios import SCENARIOS, StepSchedule, hashed_ids, read_ids, write_label_table
from shared import codec

OWNER = "owner-token-0123456789"
STRANGER = "stranger-token-0123456789"
MSGPACK = {"Content-Type": "application/msgpack"}


def best_threshold_accuracy(a: list[float], b: list[float]) -> float:
    """Accuracy of the best rule 'latency below t means a' on equally many of each."""
    n = min(len(a), len(b))
    points = sorted([(x, 0) for x in a[:n]] + [(x, 1) for x in b[:n]])
    best, below_a, below_b = 0.5, 0, 0
    for _, kind in points:
        below_a += kind == 0
        below_b += kind == 1
        correct = below_a + (n - below_b)  # a below t, b above it
        best = max(best, correct / (2 * n), 1 - correct / (2 * n))
    return best


def _runs(client: httpx.Client, ids: list[str]) -> tuple[str, str, bytes, bytes]:
    """(loaded run id, unloaded run id, a valid step body, a valid evaluate body)."""
    scenario = SCENARIOS["femnist-fedlite"]
    made = []
    for name in ("loaded", "unloaded"):
        spec = scenario.run_create(name, steps=100, seed=0)
        run = client.post("/v1/runs", json=spec.model_dump(mode="json")).json()
        answer = client.post(
            f"/v1/runs/{run['id']}/alignment",
            json={"hashed_ids": hashed_ids(run["alignment_key"], ids)},
        ).json()
        made.append((run["id"], StepSchedule(scenario, spec, answer["intersection"])))
    (loaded, schedule), (unloaded, _) = made
    first = client.post(f"/v1/runs/{loaded}/steps", content=schedule.body(1), headers=MSGPACK)
    assert first.status_code == 200, first.text
    evaluate = codec.encode_evaluate_request(
        codec.EvaluateRequest(ids_digest=bytes(8), chunks=(scenario.chunk,))
    )
    return loaded, unloaded, schedule.body(2), evaluate


def _plan(requests: int, seed: int) -> list[tuple[str, str]]:
    """(route, target) of every request, interleaved at random."""
    plan = [
        (route, target)
        for route in ("steps", "evaluate")
        for target in ("loaded", "unloaded", "unknown")
        for _ in range(requests)
    ]
    random.Random(seed).shuffle(plan)
    return plan


def over_http(url: str, ids: list[str], requests: int, seed: int) -> dict[str, Any]:
    with (
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OWNER}"}) as owner,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {STRANGER}"}) as stranger,
    ):
        loaded, unloaded, step, evaluate = _runs(owner, ids)
        times: dict[tuple[str, str], list[float]] = {}
        for route, target in _plan(requests, seed):
            run_id = {"loaded": loaded, "unloaded": unloaded}.get(target) or uuid.uuid4().hex
            body = step if route == "steps" else evaluate
            started = time.perf_counter()
            answer = stranger.post(f"/v1/runs/{run_id}/{route}", content=body, headers=MSGPACK)
            elapsed = time.perf_counter() - started
            assert answer.status_code == 404, answer.text
            times.setdefault((route, target), []).append(1000 * elapsed)
    return _report(times)


def in_process(table: Path, requests: int, seed: int) -> dict[str, Any]:
    """The same requests as calls of party B's Service in this process."""
    from party_b import auth
    from party_b.labels import load_label_table
    from party_b.metrics import Metrics
    from party_b.service import Caller, build_service
    from party_b.service.meetings import now
    from party_b.settings import Limits
    from party_b.store import make_engine, make_session_factory

    sessions = make_session_factory(make_engine(f"sqlite:///{table.parent / 'b.sqlite'}"))
    callers = []
    with sessions() as session:
        for name, token in (("owner", OWNER), ("stranger", STRANGER)):
            auth.register_token(session, name, token)
            row = auth.authenticate(session, token)
            assert row is not None
            callers.append(Caller(token_id=row.id, name=row.name))
    owner, stranger = callers
    labels = load_label_table(table, id_column="id", label_column="y", feature_columns=None)
    service = build_service(sessions=sessions, labels=labels, limits=Limits(), metrics=Metrics())
    scenario = SCENARIOS["femnist-fedlite"]
    made = []
    for name in ("loaded", "unloaded"):
        spec = scenario.run_create(name, steps=100, seed=0)
        run = service.runs.create(owner, spec)
        answer = now(
            service.alignment.align(owner, run.id, hashed_ids(run.alignment_key, read_ids(table)))
        )
        made.append((run.id, StepSchedule(scenario, spec, answer.intersection)))
    (loaded, schedule), (unloaded, _) = made
    service.steps.step(owner, loaded, schedule.body(1))
    step, evaluate = (
        schedule.body(2),
        codec.encode_evaluate_request(
            codec.EvaluateRequest(ids_digest=bytes(8), chunks=(scenario.chunk,))
        ),
    )
    times: dict[tuple[str, str], list[float]] = {}
    for route, target in _plan(requests, seed):
        run_id = {"loaded": loaded, "unloaded": unloaded}.get(target) or uuid.uuid4().hex
        call = service.steps.step if route == "steps" else service.serving.evaluate
        body = step if route == "steps" else evaluate
        started = time.perf_counter()
        try:
            call(stranger, run_id, body)
        except Exception as exc:  # ProblemError, whose constructor differs between versions
            assert getattr(exc, "status", None) == 404, exc
        else:
            raise AssertionError("another token's run was served")
        times.setdefault((route, target), []).append(1000 * (time.perf_counter() - started))
    return _report(times)


def _report(times: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    return {
        route: {
            "latency_ms": {
                target: {
                    "median": statistics.median(times[route, target]),
                    "q1": statistics.quantiles(times[route, target])[0],
                    "q3": statistics.quantiles(times[route, target])[2],
                }
                for target in ("loaded", "unloaded", "unknown")
            },
            "one_request_accuracy": {
                **{
                    f"{target}_vs_unknown": best_threshold_accuracy(
                        times[route, target], times[route, "unknown"]
                    )
                    for target in ("loaded", "unloaded")
                },
                # the same estimate between two halves of one kind: what noise alone gives
                "unknown_vs_unknown": best_threshold_accuracy(
                    times[route, "unknown"][::2], times[route, "unknown"][1::2]
                ),
            },
        }
        for route in ("steps", "evaluate")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per route and target")
    parser.add_argument("--in-process", action="store_true", help="Service, no HTTP")
    parser.add_argument("--server-root", type=Path, help="run this checkout's party B")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedlite-ids-") as tmp:
        table = write_label_table(Path(tmp) / "labels.csv", n=2000)
        if args.in_process:
            result = in_process(table, args.requests, args.seed)
        else:
            from party_b.ops.launch import local_party_b

            tokens = {"owner": OWNER, "stranger": STRANGER}
            with local_party_b(Path(tmp) / "b", table, tokens, cwd=args.server_root) as url:
                result = over_http(url, read_ids(table), args.requests, args.seed)
    for route, row in result.items():
        print(route, row)
    path = write_result(
        "run_ids" + ("-inprocess" if args.in_process else ""),
        {
            "versions": versions("fastapi", "uvicorn", "httpx", "sqlalchemy"),
            "server": args.label,
            "transport": "in-process" if args.in_process else "http",
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "requests_per_route_and_target": args.requests,
            "routes": result,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
