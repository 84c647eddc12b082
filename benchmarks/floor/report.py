"""The generated tables of the floor benchmark (``benchmarks/results/floor.json``) and of its
load test (``floor-locust.json``), for ``benchmarks.report``."""

from typing import Any

from benchmarks.common import format_ms

__all__ = ["floor_breakdown_table", "floor_locust_table", "floor_table", "http_path_table"]

_B_PARTS = ["decode", "checks", "top_step", "downlink_encode", "store_commit", "framework"]
_A_PARTS = [
    "bottom_forward",
    "quantize",
    "encode_request",
    "decode_response",
    "backward_opt",
    "local_store",
    "loop",
]


def _spread(s: dict[str, float]) -> str:
    return f"{format_ms(s['median_ms'])} ({format_ms(s['p25_ms'])}-{format_ms(s['p75_ms'])})"


def _note(doc: dict[str, Any]) -> str:
    loads = [w["loadavg_before"][0] for ws in doc["workers"].values() for w in ws]
    loads += [w["loadavg_after"][0] for ws in doc["workers"].values() for w in ws]
    workers = ", ".join(f"{len(ws)} {code}" for code, ws in doc["workers"].items())
    return (
        f"*{doc['when']}; `{doc['command']}`; code {doc['code']} against "
        f"{doc.get('baseline') or 'nothing'}; worker processes {workers}, alternating; "
        f"{doc['rounds']} rounds of {doc['block']} per worker; load average "
        f"{min(loads):.1f}-{max(loads):.1f} on {doc['machine']['cpus']} CPUs; medians "
        "(quartiles) in ms*"
    )


def floor_table(doc: dict[str, Any]) -> list[str]:
    """Per task and party: the floor, the product, their ratio, before and after."""
    lines = [
        _note(doc),
        "",
        "| task | party | floor: what it is | floor ms | product ms | product / floor "
        "| before: floor ms | before: product ms | before: ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        if r["party"] == "B":
            what = (
                f"(a) bare top step {format_ms(r['bare_top_ms'])} ({r['bare_top_threads']} thr.) "
                f"+ (b) commit {format_ms(r['commit_ms'])}; (c) in process: "
                f"{_spread(r['spread']['inprocess'])}; product = (d) over HTTP"
            )
            product = _spread(r["spread"]["http"])
        else:
            what = f"bare bottom + quantizer + backward + optimizer ({r['floor_threads']} thr.)"
            product = _spread(r["spread"]["product"])
        before = r.get("before")
        tail = (
            f"{format_ms(before['floor_ms'])} | {format_ms(before['product_ms'])} "
            f"| {before['ratio']:.1f}"
            if before
            else "– | – | –"
        )
        lines.append(
            f"| {r['task']} | {r['party']} | {what} | {format_ms(r['floor_ms'])} | {product} "
            f"| **{r['ratio']:.1f}** | {tail} |"
        )
    return lines


def floor_breakdown_table(doc: dict[str, Any]) -> list[str]:
    """Where each millisecond of the product's step goes, after (and before)."""
    lines = [
        "Party B (in process, but framework = over HTTP minus in process), ms a step:",
        "",
        "| task | version | " + " | ".join(p.replace("_", " ") for p in _B_PARTS) + " |",
        "|---|---|" + "---|" * len(_B_PARTS),
    ]
    for r in doc["records"]:
        if r["party"] == "B":
            lines += _breakdown_rows(r, _B_PARTS)
    lines += _server_cpu_rows(doc)
    lines += [
        "",
        "Party A (in process; loop = the step's time the other parts leave), ms a step:",
        "",
        "| task | version | " + " | ".join(p.replace("_", " ") for p in _A_PARTS) + " |",
        "|---|---|" + "---|" * len(_A_PARTS),
    ]
    for r in doc["records"]:
        if r["party"] == "A":
            lines += _breakdown_rows(r, _A_PARTS)
    return lines


def _server_cpu_rows(doc: dict[str, Any]) -> list[str]:
    """Party B's CPU a step over HTTP, by thread, where the run measured it."""
    rows = []
    for r in doc["records"]:
        for version, rec in (("after", r), ("before", r.get("before"))):
            cpu = (rec or {}).get("server_cpu_ms")
            if r["party"] != "B" or cpu is None:
                continue
            rows.append(
                f"| {r['task']} | {version} | {format_ms(cpu['event_loop'])} "
                f"| {format_ms(cpu['workers'])} | {format_ms(cpu['event_loop'] + cpu['workers'])} "
                f"| {format_ms(rec['product_ms'])} |"
            )
    if not rows:
        return []
    return [
        "",
        "Party B's process over HTTP, CPU ms a step (from /proc: its event loop's thread, its "
        "worker threads; all the CPU of the HTTP blocks over their steps, the requests party "
        "A's loop makes at a block's start included), beside the round trip party A sees:",
        "",
        "| task | version | event loop | worker threads | CPU in all | round trip |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def _breakdown_rows(r: dict[str, Any], parts: list[str]) -> list[str]:
    rows = []
    for version, rec in (("after", r), ("before", r.get("before"))):
        if rec is None:
            continue
        cells = [format_ms(rec["breakdown"].get(p)) for p in parts]
        rows.append(f"| {r['task']} | {version} | " + " | ".join(cells) + " |")
    return rows


def floor_locust_table(doc: dict[str, Any]) -> list[str]:
    """Steps/s of party B under locust on small steps, before and after."""
    lines = [
        f"*{doc['when']}; `{doc['command']}`; scenario {doc['scenario']}, {doc['users']} "
        f"users, {doc['run_time_s']:.0f} s runs, alternating versions; load average "
        f"{min(doc['loads']):.1f}-{max(doc['loads']):.1f}*",
        "",
        "| version | party B steps/s, each run | median | step p50 ms | step p99 ms | failures |",
        "|---|---|---|---|---|---|",
    ]
    if doc.get("declared"):
        hidden = doc.get("hidden_extras") or {}
        served = {
            code: "without " + " and ".join(names) if names else "with uvloop and httptools"
            for code, names in hidden.items()
        }
        lines[0:0] = [
            "Each version served with what its own pyproject.toml installs: before "
            f"{served.get('before', '?')}, after {served.get('after', '?')}.",
            "",
        ]
    for code in ("before", "after"):
        runs = doc["runs"].get(code, [])
        if not runs:
            continue
        rates = ", ".join(format_ms(r["steps_per_s"]) for r in runs)
        p50 = ", ".join(format_ms(r["p50_ms"]) for r in runs)
        p99 = ", ".join(format_ms(r["p99_ms"]) for r in runs)
        failures = sum(r["failures"] or 0 for r in runs)
        lines.append(
            f"| {code} | {rates} | {format_ms(doc['median_steps_per_s'][code])} | {p50} | {p99} "
            f"| {failures} |"
        )
    if "gain" in doc:
        lines += ["", f"Gain in steps/s, after / before: **{doc['gain']:.2f}x**."]
    return lines


def http_path_table(doc: dict[str, Any]) -> list[str]:
    """Round trips of each layer of party B's HTTP path under each loop and parser
    (``benchmarks.floor.http_path``), with what each layer adds to the one before."""
    loads = doc["loads"]
    lines = [
        f"*{doc['when']}; `{doc['command']}`; {doc['body_bytes']:,}-byte bodies from an "
        f"httpx.Client, {doc['rounds']} rounds of {doc['block']} per server, servers taking "
        f"turns; load average {min(loads):.1f}-{max(loads):.1f}; medians (quartiles) in ms*",
        "",
        "| layer | asyncio + h11 | adds | uvloop + httptools | adds |",
        "|---|---|---|---|---|",
    ]
    by = {(r["layer"], r["loop"]): r for r in doc["rows"]}
    layers = list(dict.fromkeys(r["layer"] for r in doc["rows"]))
    loops = list(dict.fromkeys(r["loop"] for r in doc["rows"]))
    for i, layer in enumerate(layers):
        cells = []
        for loop in loops:
            r = by[(layer, loop)]
            before = by[(layers[i - 1], loop)]["median_ms"] if i else None
            adds = "–" if before is None else f"{r['median_ms'] - before:+.2f}"
            cells += [_spread(r), adds]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines
