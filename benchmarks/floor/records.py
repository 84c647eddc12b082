"""From the floor benchmark's samples to its records: one per task and party.

Party B's record: ``floor_ms`` = (a) + (b) (the bare top step at its best thread count, plus
the bare commit), ``product_ms`` = (d) (over HTTP), ``inprocess_ms`` = (c), ``ratio`` =
(d) / floor, and ``breakdown``: medians per step of decode (msgpack and dequantize), checks
(everything of ``Steps.step`` the other parts leave: order, digest, shapes, labels, lock,
metrics), top step (forward, backward, optimizer), downlink encode, store commit, and
framework (HTTP round trip minus party B's in-process step: the client, uvicorn, FastAPI,
authentication, the thread hand-off); ``server_cpu_ms``: the CPU time ``fedlite-b serve``
spent a step over HTTP, in its event loop's thread and in its worker threads (all steps of
all HTTP blocks, ``measure.thread_cpu``). Party A's record: ``floor_ms`` = the bare step at its
best thread count, ``product_ms`` = the product's step minus its round trip (in process;
``product_http_ms`` over HTTP), and its breakdown. Every time is a median over all steps (or
calls) of every worker of that version; ``spread`` gives the quartiles.
"""

import statistics
from typing import Any

from benchmarks.floor.measure import A_PARTS, B_PARTS, summary

__all__ = ["records"]

B_BREAKDOWN = ["decode", "checks", "top_step", "downlink_encode", "store_commit", "framework"]
A_BREAKDOWN = [p for *_, p in A_PARTS] + ["loop"]


def _median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values) if values else float("nan")


def _best(by_threads: dict[str, list[float]]) -> tuple[str, dict[str, dict[str, float]]]:
    """The thread count with the lowest median, and every count's summary."""
    summaries = {n: summary(v) for n, v in by_threads.items()}
    best = min(summaries, key=lambda n: summaries[n]["median_ms"])
    return best, summaries


def _party_b(task: str, s: dict[str, Any]) -> dict[str, Any]:
    best, tops = _best(s["bare_top"])
    commit = summary(s["commit"])
    local, http = s["inprocess"], s["http"]
    c, d = summary(local["round_trip"]), summary(http["round_trip"])
    floor = tops[best]["median_ms"] + commit["median_ms"]
    # "service" is Steps.step's self time: what the other parts leave of it (the checks)
    b_parts = {p for *_, p in B_PARTS} - {"service"}
    per_part = {p: [step.get(p, 0.0) for step in local["parts"]] for p in b_parts}
    checks = [step.get("service", 0.0) for step in local["parts"]]
    service = [sum(step.get(p, 0.0) for p in b_parts | {"service"}) for step in local["parts"]]
    breakdown = {p: _median_ms(per_part[p]) for p in b_parts}
    breakdown["checks"] = _median_ms(checks)
    breakdown["framework"] = d["median_ms"] - _median_ms(service)
    out = {
        "task": task,
        "party": "B",
        "floor_ms": floor,
        "product_ms": d["median_ms"],
        "ratio": d["median_ms"] / floor,
        "inprocess_ms": c["median_ms"],
        "inprocess_ratio": c["median_ms"] / floor,
        "bare_top_ms": tops[best]["median_ms"],
        "bare_top_threads": int(best),
        "commit_ms": commit["median_ms"],
        "service_ms": _median_ms(service),
        "breakdown": {k: breakdown[k] for k in B_BREAKDOWN},
        "spread": {"bare_top": tops, "commit": commit, "inprocess": c, "http": d},
    }
    cpu = s.get("http_cpu")  # (none where /proc has no schedstat: not Linux)
    if cpu:
        steps = sum(b["steps"] for b in cpu)
        out["server_cpu_ms"] = {
            k: 1000 * sum(b[k] for b in cpu) / steps for k in ("event_loop", "workers")
        }
    return out


def _party_a(task: str, s: dict[str, Any]) -> dict[str, Any]:
    totals = {n: [sum(step.values()) for step in steps] for n, steps in s["bare_bottom"].items()}
    best, bare = _best(totals)
    floor_parts = {
        p: _median_ms([step[p] for step in s["bare_bottom"][best]])
        for p in s["bare_bottom"][best][0]
    }
    local, http = s["inprocess"], s["http"]
    product, over_http = summary(local["party_a"]), summary(http["party_a"])
    a_parts = [p for *_, p in A_PARTS]
    breakdown = {p: _median_ms([step.get(p, 0.0) for step in local["parts"]]) for p in a_parts}
    breakdown["loop"] = _median_ms(
        [
            total - sum(step.get(p, 0.0) for p in a_parts)
            for total, step in zip(local["party_a"], local["parts"], strict=True)
        ]
    )
    return {
        "task": task,
        "party": "A",
        "floor_ms": bare[best]["median_ms"],
        "product_ms": product["median_ms"],
        "ratio": product["median_ms"] / bare[best]["median_ms"],
        "product_http_ms": over_http["median_ms"],
        "floor_threads": int(best),
        "floor_breakdown": floor_parts,
        "breakdown": {k: breakdown[k] for k in A_BREAKDOWN},
        "spread": {"bare": bare, "product": product, "product_http": over_http},
    }


def records(samples: dict[str, Any], workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per task and party from one version's merged samples."""
    out = []
    for task, s in samples.items():
        b, a = _party_b(task, s), _party_a(task, s)
        for rec in (b, a):
            rec["loadavg"] = [w["loadavg_before"][0] for w in workers] + [
                w["loadavg_after"][0] for w in workers
            ]
            rec["torch_default_threads"] = workers[0]["torch_default_threads"]
        out += [b, a]
    return out
