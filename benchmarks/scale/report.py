"""Tables of the scale benchmarks for docs/PERFORMANCE.md (``benchmarks.report``): party B's
throughput under locust and in process (``benchmarks.scale.throughput``), both parties'
memory and party B's runs in memory under a bound (``benchmarks.scale.memory``), and replicas
under locust (``benchmarks.scale.replicas``)."""

from typing import Any

from benchmarks.common import format_ms, load_note

__all__ = ["memory_bounded_table", "memory_tables", "replicas_table", "throughput_table"]


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


def _whole_ms(x: float | None) -> str:
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
            f"| {row['replicas']} | {row['users']} | {rate} | {_whole_ms(row['p50_ms'])} "
            f"| {_whole_ms(row['p99_ms'])} | {row['failures']} |"
        )
    return lines


def throughput_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{load_note(doc)}; scenario {doc['scenario']}; party B torch threads "
        f"{doc.get('party_b_torch_threads') or 'default'}*",
        "",
        "| concurrent runs | HTTP steps/s | p50 ms | p99 ms | failures | in-process steps/s "
        "| p50 ms | p99 ms | HTTP / in-process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        h, i = row["http"], row["in_process"]
        lines.append(
            f"| {row['users']} | {format_ms(h['steps_per_s'])} | {format_ms(h['p50_ms'])} | "
            f"{format_ms(h['p99_ms'])} | {h['failures']} | {format_ms(i['steps_per_s'])} | "
            f"{format_ms(i['p50_ms'])} | {format_ms(i['p99_ms'])} | {row['http_ratio']:.2f} |"
        )
    return lines


def memory_tables(doc: dict[str, Any]) -> list[str]:
    a, b = doc["party_a"], doc["party_b"]
    mib = 1 / 2**20
    lines = [
        f"*{load_note(doc)}*",
        "",
        "| party A (FEMNIST, B=20, FedLite) | MiB |",
        "|---|---|",
        f"| idle process with torch imported (peak RSS) | {a['idle_torch_kib'] / 1024:.1f} |",
        f"| bare torch: the same bottom steps and quantizer, nothing else (peak RSS) | "
        f"{a.get('bare_torch_steps_kib', 0) / 1024:.1f} |",
        f"| party A after its imports (peak RSS) | {a['after_imports_kib'] / 1024:.1f} |",
        f"| party A peak RSS over {a['steps']} training steps | {a['peak_kib'] / 1024:.1f} |",
        f"| **peak above idle torch** | **{a['peak_above_idle_torch_bytes'] * mib:.1f}** |",
        f"| peak above party A's own imports | {a['peak_above_own_imports_bytes'] * mib:.1f} |",
    ]
    for item, nbytes in a["needed_bytes"].items():
        lines.append(f"| needed: {item.replace('_', ' ')} | {nbytes * mib:.2f} |")
    lines += [
        f"| **needed, total** | **{a['needed_total_bytes'] * mib:.1f}** |",
        "",
        "| party B | RSS MiB |",
        "|---|---|",
    ]
    for r in b["rss_by_steps"]:
        lines.append(f"| after {r['steps']} steps of one run | {r['rss_kib'] / 1024:.1f} |")
    for r in b["rss_by_finished_runs"]:
        lines.append(f"| after {r['finished_runs']} finished runs | {r['rss_kib'] / 1024:.1f} |")
    return lines
