"""Tables of the WAN benchmark (``wan.json``) and of accuracy against pipeline depth
(``staleness.json``) for ``benchmarks.report``."""

import statistics
from typing import Any

from benchmarks.wan.netns import burst_bytes

__all__ = ["bound", "cpu_bound", "network_bound", "points", "staleness_table", "wan_table"]


def _kb(x: float) -> str:
    return f"{x / 1000:.1f}" if x < 10_000 else f"{x / 1000:.0f}"


def network_bound(r: dict[str, Any]) -> float:
    """Steps/s the link alone would allow (no compute), from the bytes per step on the wire
    (the link's own counters; the messages' bytes in records from before they were kept).

    Each direction carries the link's rate, and K steps are in flight: at most K round trips
    of steps per RTT plus the part of a step's transfers the link's token bucket does not
    pass at once (tbf: ``netns.burst_bytes``; a 33 KB message on an idle 20 Mbit/s link
    arrives after the RTT alone), and at most the busier direction's rate over its bytes."""
    bytes_per_s = r["mbit"] * 1e6 / 8
    up = r.get("wire_up_bytes_per_step", r["uplink_bytes_per_step"])
    down = r.get("wire_down_bytes_per_step", r["downlink_bytes_per_step"])
    burst = burst_bytes(r["mbit"])
    queued = (max(0.0, up - burst) + max(0.0, down - burst)) / bytes_per_s
    serial = queued + r["rtt_ms"] / 1000
    return float(min(r["depth"] / serial, bytes_per_s / max(up, down)))


def cpu_bound(r: dict[str, Any], cores: int) -> float | None:
    """Steps/s the machine's cores would allow if every process of the run (party A, party
    B, the latency proxy) kept them busy: cores / the CPU seconds all of them spent per
    step in that run. None for records from before CPU was counted."""
    cpu = r.get("cpu_s_per_step")
    if not cpu:
        return None
    return float(cores / sum(cpu.values()))


def bound(r: dict[str, Any], cores: int) -> tuple[float, str]:
    """The nearer of the run's two bounds, and which one it is (``link`` or ``cpu``)."""
    link, cpu = network_bound(r), cpu_bound(r, cores)
    return (link, "link") if cpu is None or link <= cpu else (cpu, "cpu")


def points(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs grouped by point (task, link, method, depth), in their first run's order:
    each point's repeats, its median, spread and its worst fraction of its bound."""
    cores = int(doc["machine"]["cpus"])
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in doc["runs"]:
        key = (r["task"], r["mbit"], r["rtt_ms"], r["method_name"], r["depth"])
        grouped.setdefault(key, []).append(r)
    out = []
    for runs in grouped.values():
        rates = [r["steps_per_s"] for r in runs]
        bounds = [bound(r, cores) for r in runs]
        fractions = [r["steps_per_s"] / b for r, (b, _) in zip(runs, bounds, strict=True)]
        out.append(
            {
                "runs": runs,
                "median": statistics.median(rates),
                "low": min(rates),
                "high": max(rates),
                "bound": statistics.median(b for b, _ in bounds),
                "bound_kind": "/".join(sorted({k for _, k in bounds})),
                "worst_fraction": min(fractions),
                "max_gap_ms": max(r.get("max_gap_ms", float("nan")) for r in runs),
            }
        )
    return out


def wan_table(doc: dict[str, Any]) -> list[str]:
    if doc.get("skipped"):
        return [f"*Skipped: {doc['skipped']}*"]
    s = doc["settings"]
    repeats = s.get("repeats", 1)
    lines = [
        f"*{doc['when']} on {doc['machine']['cpus']} CPUs (shared), `{doc['command']}`; "
        f"{doc['latency']}; steady rate after {s['warmup']} of {s['steps']} steps; "
        f"{repeats} run(s) of every point, interleaved. Bound: the nearer of the link's "
        "(from the bytes the link carried per step, its rate and RTT) and the CPU's (the "
        "cores over the CPU seconds party A, party B and the latency proxy spent per step); "
        "fraction: the worst run's steps/s over its own bound. Largest gap: the longest wait "
        "between two applied steps in any run of the point.*",
        "",
        "| task | link | method | K | steps/s median (min-max) | s/step | uplink KB/step "
        "| downlink KB/step | × SplitFed K=1 | bound steps/s (which) | worst fraction of bound "
        "| largest gap ms | resent |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points(doc):
        r = p["runs"][0]
        ratios = [x["vs_splitfed_k1"] for x in p["runs"] if x.get("vs_splitfed_k1")]
        method = r["method_name"]
        if r.get("downlink") and r["downlink"] not in method:  # e.g. fedlite+default (int4)
            method += f" ({r['downlink']} down)"
        lines.append(
            f"| {r['task']} | {r['mbit']:g} Mbit/s, {r['rtt_ms']:g} ms | {method} "
            f"| {r['depth']} | {p['median']:.2f} ({p['low']:.2f}-{p['high']:.2f}) "
            f"| {1 / p['median']:.3f} "
            f"| {_kb(r['uplink_bytes_per_step'])} | {_kb(r['downlink_bytes_per_step'])} "
            f"| {f'{statistics.median(ratios):.1f}' if ratios else '–'} "
            f"| {p['bound']:.1f} ({p['bound_kind']}) | {p['worst_fraction']:.2f} "
            f"| {p['max_gap_ms']:.0f} | {sum(x['resent'] for x in p['runs'])} |"
        )
    return lines


def staleness_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{doc['when']}, `{doc['command']}`; FedLite runs "
        f"{doc['settings']['credit']} and {doc['settings']['femnist']} (K = 1 key shown), "
        "party B in process.*",
        "",
        "| task | seed | K | steps | eval accuracy | eval AUC | eval loss | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        final = r["final"]
        auc = final.get("eval_auc")
        lines.append(
            f"| {r['task']} | {r['seed']} | {r['depth']} | {r['steps']} "
            f"| {final.get('eval_accuracy', float('nan')):.4f} "
            f"| {'–' if auc is None else f'{auc:.4f}'} | {final['eval_loss']:.4f} "
            f"| {r['seconds']:.0f} |"
        )
    return lines
