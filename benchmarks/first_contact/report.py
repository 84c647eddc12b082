"""Tables of the first-contact benchmark (``first_contact.json``) for ``benchmarks.report``:
command start-up, alignment bytes before and after the binary alignment, and when a first
``fedlite-a train`` says what."""

from typing import Any

__all__ = ["first_contact_table"]


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def first_contact_table(doc: dict[str, Any]) -> list[str]:
    load = f"load average {doc['loadavg_before'][0]:.1f} → {doc['loadavg_after'][0]:.1f}"
    lines = [
        f"*{doc['when']}, {doc['machine']['cpus']} CPUs (shared), {load}; "
        f"`{doc['command']}`; party A {doc['sizes']['party_a_ids']:,} ids, party B "
        f"{doc['sizes']['party_b_ids']:,} (FATE default_credit)*",
        "",
        "| command (fresh process) | median | fastest |",
        "|---|---|---|",
    ]
    for name, t in doc["startup"].items():
        lines.append(f"| `{name}` | {t['median_s']:.2f} s | {t['min_s']:.2f} s |")
    b = doc["alignment_bytes"]
    lines += [
        "",
        f"| on the wire ({b['psi']['common']:,} ids in common) | up | down | total |",
        "|---|---|---|---|",
    ]
    for key, what in (
        ("psi", "PSI (`POST /v1/psi`)"),
        ("json", "alignment, JSON (hex keys both ways; before)"),
        ("keys", "alignment, binary (16-byte prefixes up, a bit per key down)"),
    ):
        part = b[key]
        lines.append(
            f"| {what} | {_mb(part['sent'])} | {_mb(part['received'])} | {_mb(part['total'])} |"
        )
    before, after = b["first_contact_before"], b["first_contact_after"]
    ratio = before / after
    lines.append(
        f"| **PSI + alignment** | | | {_mb(before)} → **{_mb(after)}** ({ratio:.1f}x less) |"
    )
    lines += [
        "",
        "| `fedlite-a train`, 20 steps, as soon as party B is up (median run; every run) "
        "| first line | step 1 done | all done |",
        "|---|---|---|---|",
    ]
    for key in ("baseline", "current"):
        t = doc.get(key)
        if t is None:
            continue
        what = f"before ({t['label']})" if key == "baseline" else "now"
        every = t.get("all_runs", [t])

        def cell(name: str, t: dict[str, Any] = t, every: list[dict[str, Any]] = every) -> str:
            each = ", ".join(f"{r[name]:.1f}" for r in every)
            return f"{t[name]:.1f} s ({each})" if len(every) > 1 else f"{t[name]:.1f} s"

        lines.append(
            f"| {what} | {cell('first_line_s')} | {cell('first_step_s')} | {cell('total_s')} |"
        )
    current = doc.get("current")
    if current:
        lines += [
            "",
            "What `fedlite-a train` said before its first step, in the median run (seconds "
            "since launch):",
            "",
            "```",
        ]
        lines += [f"{s:6.1f}  {text}" for s, text in current["lines"]]
        lines += ["```"]
    return lines
