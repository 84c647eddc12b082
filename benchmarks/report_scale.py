"""Tables of party B's scaling benchmarks for docs/PERFORMANCE.md: runs in memory under a bound
(``benchmarks.memory --bounded-only``) and replicas under locust (``benchmarks.replicas``)."""

from typing import Any

__all__ = ["memory_bounded_table", "replicas_table"]


def _note(doc: dict[str, Any]) -> str:
    return (
        f"{doc['when']}, {doc['machine']['cpus']} CPUs ({doc['machine']['cpu']}), load average "
        f"{doc['loadavg_before'][0]:.1f} → {doc['loadavg_after'][0]:.1f}; `{doc['command']}`"
    )


def memory_bounded_table(doc: dict[str, Any]) -> list[str]:
    """Party B's RSS as open runs grow, without a bound and with ``--max-live-runs``."""
    lines = [
        f"*{_note(doc)}; top model of {doc['top_parameters']:,} parameters, Adam; every run "
        "open (3 steps, never finished)*",
        "",
        f"| open runs | RSS MiB, no bound | RSS MiB, at most {doc['cap']} in memory |",
        "|---|---|---|",
    ]
    for free, capped in zip(doc["rss_unbounded"], doc["rss_bounded"], strict=True):
        lines.append(
            f"| {free['open_runs']} | {free['rss_kib'] / 1024:,.0f} "
            f"| {capped['rss_kib'] / 1024:,.0f} |"
        )
    lines += [
        "",
        f"Growth per open run without a bound: {doc['growth_per_run_unbounded_kib'] / 1024:.0f} "
        f"MiB; with the bound, from the first run past it to the last: "
        f"{doc['growth_past_cap_kib'] / 1024:.1f} MiB.",
    ]
    return lines


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f}"


def replicas_table(doc: dict[str, Any]) -> list[str]:
    """Steps/s and step latency with 1, 2 and 4 replicas behind HAProxy."""
    lines = [
        f"*{_note(doc)}; scenario {doc['scenario']}; {doc.get('haproxy') or 'HAProxy'}; every "
        "replica, PostgreSQL, HAProxy and locust on this machine*",
        "",
        "| replicas | concurrent runs | steps/s (party B's count) | step p50 ms | step p99 ms "
        "| failures |",
        "|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        rate = "–" if row["steps_per_s"] is None else f"{row['steps_per_s']:.1f}"
        lines.append(
            f"| {row['replicas']} | {row['users']} | {rate} | {_ms(row['p50_ms'])} "
            f"| {_ms(row['p99_ms'])} | {row['failures']} |"
        )
    return lines
