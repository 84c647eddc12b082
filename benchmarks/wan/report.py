"""Tables of the WAN benchmark (``wan.json``) and of accuracy against pipeline depth
(``staleness.json``) for ``benchmarks.report``."""

from typing import Any

__all__ = ["staleness_table", "wan_table"]


def _kb(x: float) -> str:
    return f"{x / 1000:.1f}" if x < 10_000 else f"{x / 1000:.0f}"


def network_bound(r: dict[str, Any]) -> float:
    """Steps/s the link alone would allow (no compute), from the measured bytes per step:
    K = 1 waits for both transfers and a round trip; K > 1 overlaps K of those, up to the
    busier direction's bandwidth (each direction has the link's rate)."""
    bytes_per_s = r["mbit"] * 1e6 / 8
    up = r["uplink_bytes_per_step"] / bytes_per_s
    down = r["downlink_bytes_per_step"] / bytes_per_s
    serial = up + down + r["rtt_ms"] / 1000
    return float(min(r["depth"] / serial, 1 / max(up, down)))


def wan_table(doc: dict[str, Any]) -> list[str]:
    if doc.get("skipped"):
        return [f"*Skipped: {doc['skipped']}*"]
    s = doc["settings"]
    lines = [
        f"*{doc['when']} on {doc['machine']['cpus']} CPUs (shared), `{doc['command']}`; "
        f"{doc['latency']}; steady rate after {s['warmup']} of {s['steps']} steps. "
        "Link-only bound: computed from the measured bytes and the link's rate and RTT "
        "(no compute), not measured.*",
        "",
        "| task | link | method | K | steps/s | s/step | uplink KB/step | downlink KB/step "
        "| × SplitFed K=1 | link-only bound steps/s | resent |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        ratio = r.get("vs_splitfed_k1")
        method = r["method_name"]
        if r.get("downlink") and r["downlink"] not in method:  # e.g. fedlite+default (int4)
            method += f" ({r['downlink']} down)"
        lines.append(
            f"| {r['task']} | {r['mbit']:g} Mbit/s, {r['rtt_ms']:g} ms | {method} "
            f"| {r['depth']} | {r['steps_per_s']:.2f} | {r['seconds_per_step']:.3f} "
            f"| {_kb(r['uplink_bytes_per_step'])} | {_kb(r['downlink_bytes_per_step'])} "
            f"| {'–' if ratio is None else f'{ratio:.1f}'} | {network_bound(r):.1f} "
            f"| {r['resent']} |"
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
