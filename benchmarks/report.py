"""Render benchmarks/results/*.json into the generated section of docs/PERFORMANCE.md.

    python -m benchmarks.report            # rewrites the section between the markers

Only the part between ``<!-- BEGIN GENERATED -->`` and ``<!-- END GENERATED -->`` changes;
the prose around it is written by hand.
"""

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, format_ms, load_note
from benchmarks.first_contact.report import first_contact_table
from benchmarks.floor.report import (
    floor_breakdown_table,
    floor_locust_table,
    floor_table,
    http_path_table,
)
from benchmarks.scale.report import (
    memory_bounded_table,
    memory_tables,
    replicas_table,
    throughput_table,
)
from benchmarks.scoring import scoring_table
from benchmarks.tables.report import preparation_table
from benchmarks.wan.report import staleness_table, wan_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def quantizer_table(doc: dict[str, Any]) -> list[str]:
    methods = ["ours", "ours_all", "ours_sub256", "faiss", "faiss_all", "sklearn"]
    methods = [m for m in methods if any(m in row for row in doc["rows"])]
    lines = [
        f"*{load_note(doc)}; `{doc['command']}`*",
        "",
        "| shape | " + " | ".join(f"{m} ms (error)" for m in methods)
        + " | ours / fastest rival (wall) | same, CPU time | ours CPU / floor |",
        "|---|" + "---|" * (len(methods) + 3),
    ]  # fmt: skip
    for row in doc["rows"]:
        cells = []
        for m in methods:
            r = row.get(m)
            cells.append("–" if not r else f"{format_ms(r['median_ms'])} ({r['rel_error']:.4f})")
        ratio = row.get("ratio_to_fastest_rival")
        cpu = row.get("cpu_ratio_to_fastest_rival")
        floor = row.get("floor")
        extra = [
            f"{ratio:.2f}",
            "–" if cpu is None else f"{cpu:.2f}",
            "–"
            if floor is None
            else f"{row['ratio_to_floor']:.1f} (floor {format_ms(floor['floor_ms'])})",
        ]
        lines.append(f"| {row['tag']} | " + " | ".join(cells + extra) + " |")
    bottom = doc["femnist_bottom_step"]["median_ms"]
    lines += [
        "",
        f"FEMNIST bottom forward + backward + SGD (B=20), same run: {format_ms(bottom)} ms.",
    ]
    if "first_call" in doc:
        first = doc["first_call"]
        lines.append(
            f"First quantize of a fresh process (numba kernels): {first['cold_cache_s']:.1f} s "
            f"compiling into an empty cache, {first['warm_cache_s']:.2f} s loading a warm one."
        )
    return lines


def quantizer_target_table(one: dict[str, Any], default: dict[str, Any] | None) -> list[str]:
    """Issue 17's quantizer target, shape by shape, from both quantizer runs: ours against
    faiss, trained on its default subsample (256 L points) and on all points.

    Met when our median CPU time is at most the faster faiss variant's and our median error
    at most the lower faiss error (within 0.5 %, well inside the seed-to-seed spread). CPU
    time, not the wall clock: on this shared, loaded machine the wall clock mostly counts
    waiting for a core. The floor is benchmarks/quantizer.py's ``floor_ms``.
    """
    runs = [("1", one)]
    if default is not None:
        runs.append((f"default ({default['machine']['torch_threads']})", default))
    lines = [
        "| shape | threads | ours CPU ms (error) | faiss CPU ms (error) | faiss all points "
        "CPU ms (error) | ours / faster faiss, CPU (wall) | error vs lower faiss | met? "
        "| ours CPU / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for threads, doc in runs:
        for row in doc["rows"]:
            if "faiss" not in row:
                continue
            ours, rivals = row["ours"], [row[k] for k in ("faiss", "faiss_all") if k in row]
            cpu = ours["cpu_median_ms"] / min(r["cpu_median_ms"] for r in rivals)
            wall = ours["median_ms"] / min(r["median_ms"] for r in rivals)
            lowest = min(r["rel_error"] for r in rivals)
            error = ours["rel_error"] / lowest - 1
            met = cpu <= 1.0 and ours["rel_error"] <= lowest * 1.005
            cells = [
                f"{format_ms(r['cpu_median_ms'])} ({r['rel_error']:.4f})" for r in [ours, *rivals]
            ]
            lines.append(
                f"| {row['tag']} | {threads} | " + " | ".join(cells)
                + f" | {cpu:.2f} ({wall:.2f}) | {100 * error:+.2f} % "
                + f"| {'**met**' if met else '**not met**'} | {row['ratio_to_floor']:.1f} |"
            )  # fmt: skip
    return lines


def codec_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{load_note(doc)}*",
        "",
        "| shape | FedLite request B | enc/dec µs | SplitFed request B | enc/dec µs "
        "| gradient response B | enc/dec µs | compression |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        cells = []
        for key in ("step_request_fedlite", "step_request_splitfed", "step_response"):
            r = row[key]
            cells += [f"{r['bytes']:,}", f"{r['encode_us']:.0f} / {r['decode_us']:.0f}"]
        lines.append(f"| {row['tag']} | " + " | ".join(cells) + f" | {row['compression']:.0f}× |")
    return lines


def step_table(doc: dict[str, Any]) -> list[str]:
    sessions = doc["sessions"]
    names = ["fedlite/inprocess", "fedlite/http", "splitfed/inprocess", "splitfed/http"]
    parts = list(sessions[names[0]]["party_a"])
    lines = [
        f"*{load_note(doc)}; medians over {doc['steps']} steps per session*",
        "",
        "| part (ms) | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for part in parts:
        values = [format_ms(sessions[n]["party_a"][part]["median_ms"]) for n in names]
        lines.append(f"| A: {part} | " + " | ".join(values) + " |")
    for part in sessions[names[0]]["party_b"]:
        values = [format_ms(sessions[n]["party_b"][part]) for n in names]
        lines.append(f"| B: {part} | " + " | ".join(values) + " |")
    for part in sessions[names[0]]["codec"]:
        values = [format_ms(sessions[n]["codec"][part]) for n in names]
        lines.append(f"| codec: {part} | " + " | ".join(values) + " |")
    lines += ["", "| overhead of HTTP + codec | FedLite | SplitFed |", "|---|---|---|"]
    derived = {mode: step_overheads(sessions, mode) for mode in ("fedlite", "splitfed")}
    for key, label in (
        ("by_round_trips", "HTTP round trip − in-process round trip, + codec"),
        ("by_server_time", "HTTP round trip − party B's own step time (its log), + codec"),
    ):
        cells = [
            f"{format_ms(derived[m][key + '_ms'])} ms = {100 * derived[m][key]:.1f} % of the step"
            for m in derived
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def step_overheads(sessions: dict[str, Any], mode: str) -> dict[str, float]:
    """The target's two readings of 'HTTP + codec overhead', as shares of the HTTP step."""
    http, local = sessions[f"{mode}/http"], sessions[f"{mode}/inprocess"]
    total = http["party_a"]["total"]["median_ms"]
    codec_ms = sum(http["codec"].values())
    round_trip = http["party_a"]["round_trip"]["median_ms"]
    by_round_trips = round_trip - local["party_a"]["round_trip"]["median_ms"] + codec_ms
    by_server = round_trip - http["party_b"]["service_total_ms"] + codec_ms
    return {
        "by_round_trips_ms": by_round_trips,
        "by_round_trips": by_round_trips / total,
        "by_server_time_ms": by_server,
        "by_server_time": by_server / total,
    }


def schedule_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{load_note(doc)}; `{doc['command']}`*",
        "",
        "| task (aligned ids, clients) | version | split ms | shuffle: epoch ms | shuffle: "
        "per step, amortized ms | clients: build ms | clients: per step ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        clients = f", {r['clients']} clients" if "clients" in r else ""
        build = format_ms(r["clients_build"]["median_ms"]) if "clients_build" in r else "–"
        step = format_ms(r["clients_step"]["median_ms"]) if "clients_step" in r else "–"
        lines.append(
            f"| {r['task']} ({r['aligned']:,}{clients}) | {r['version']} "
            f"| {format_ms(r['split']['median_ms'])} "
            f"| {format_ms(r['shuffle_epoch']['median_ms'])} "
            f"| {format_ms(r['shuffle_amortized_ms'])} | {build} | {step} |"
        )
    return lines


def traffic_table(doc: dict[str, Any]) -> list[str]:
    """One row per (task, method) of benchmarks/results/traffic.json: bytes, and the metric
    as the mean over the seeds with its range (records without a seed are seed 0)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in doc["records"]:
        groups.setdefault((r["task"], r["method"]), []).append(r)
    lines = [
        f"*{doc['when']}; `{doc['command']}`; bytes are len() of the real step messages, "
        "per step, averaged over the run; every method of a task trains for the same steps "
        "as its SplitFed run of the same seed; value: the mean over the seeds (min-max); "
        "relative change: the mean of each seed's change against its SplitFed run*",
        "",
        "| task | method (uplink / downlink) | seeds | steps | up B/step | down B/step | SplitFed "
        "B/step (both ways) | total ratio | metric | value | SplitFed | relative change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (task, method), runs in groups.items():
        values = [r["value"] for r in runs]
        spread = f" ({min(values):.4f}-{max(values):.4f})" if len(runs) > 1 else ""
        change = sum((r["value"] - r["splitfed_value"]) / r["splitfed_value"] for r in runs)
        r = runs[0]
        lines.append(
            f"| {task} | {method} | {len(runs)} | {r['steps']} "
            f"| {_mean(runs, 'uplink_bytes_per_step'):,.0f} "
            f"| {_mean(runs, 'downlink_bytes_per_step'):,.0f} "
            f"| {_mean(runs, 'splitfed_bytes_per_step'):,.0f} "
            f"| {_mean(runs, 'total_ratio'):,.1f}x | {r['metric']} "
            f"| {sum(values) / len(runs):.4f}{spread} | {_mean(runs, 'splitfed_value'):.4f} "
            f"| {100 * change / len(runs):+.1f} % |"
        )
    return lines


def device_check_tables(doc: dict[str, Any]) -> list[str]:
    """benchmarks/device_check.py's record: the card, every check, the k-means comparison and
    steps/s on the device against the CPU."""
    device, checks = doc["device"], doc["checks"]
    lines = [
        f"On **{device['name']}** (torch {device['torch']}, CUDA {device['cuda']}; "
        f"{doc['machine']['cpus']} CPUs: {doc['machine']['cpu']}), `{doc['command']}`, "
        f"{doc['when']}, {doc['mode']} mode, {doc['seconds']:.0f} s.",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for name, check in checks.items():
        lines.append(f"| {name} | {'passed' if check.get('ok') else '**failed**'} |")
    resume = checks.get("femnist_resume", {})
    if "bit_identical" in resume:
        same = ", ".join(
            f"{k} {'same' if v else 'DIFFERENT'}" for k, v in resume["bit_identical"].items()
        )
        lines += ["", f"Killed at step {resume['killed_at']}, resumed from step "
                  f"{resume['resumed_from']}: {same} (against an uninterrupted run)."]  # fmt: skip
    kmeans = checks.get("kmeans", {}).get("shapes", [])
    if kmeans:
        lines += [
            "",
            f"k-means, torch on the device against {checks['kmeans']['cpu_backend']} on the CPU "
            "(FEMNIST activations, chunks of 20 images):",
            "",
            "| q | R | L | codewords equal (min / mean) | codebook max abs diff | relative error "
            "CPU / device | run to run | ms per chunk CPU / device |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in kmeans:
            lines.append(
                f"| {r['q']} | {r['R']} | {r['L']} | {r['codeword_agreement_min']:.4f} / "
                f"{r['codeword_agreement_mean']:.4f} | {r['codebook_max_abs_diff']:.2e} | "
                f"{r['relative_error_cpu']:.4f} / {r['relative_error_device']:.4f} | "
                f"{'identical' if r['device_run_to_run_identical'] else 'DIFFERENT'} | "
                f"{r['cpu_ms_per_chunk']:.2f} / {r['device_ms_per_chunk']:.2f} |"
            )
    rows = checks.get("speed", {}).get("rows", [])
    if rows:
        lines += [
            "",
            "| task | method | device steps/s | CPU steps/s | device / CPU |",
            "|---|---|---|---|---|",
        ]
        rows = [r for r in rows if "steps_per_second" in r]  # a failed row says why in the JSON
        cpu = {(r["task"], r["method"]): r for r in rows if r["side"] == "cpu"}
        for r in (r for r in rows if r["side"] == "device"):
            base = cpu.get((r["task"], r["method"]))
            versus = (
                f"{base['steps_per_second']:.2f} ({base['torch_threads']} threads) | "
                f"{r['steps_per_second'] / base['steps_per_second']:.1f}x"
                if base
                else "- | -"
            )
            lines.append(
                f"| {r['task']} | {r['method']} | {r['steps_per_second']:.1f} | {versus} |"
            )
    if doc.get("warnings"):
        lines += ["", "Warnings: " + "; ".join(f"`{w}`" for w in doc["warnings"])]
    return lines


def parties_table(doc: dict[str, Any]) -> list[str]:
    """benchmarks/results/parties.json: N = 1 and N = 2 feature parties, FedLite and
    SplitFed, per task: the held-out metric over the seeds and each party's bytes a step."""
    target = doc["target"]
    gap = target["gap"]
    verdict = "**met**" if target["met"] else "**not met**"
    lines = [
        f"*{load_note(doc)}; `{doc['command']}`; value: the mean over the seeds "
        "(± sample standard deviation); gap: N = 2's mean minus N = 1's, the same method; bytes "
        "are len() of the step messages (HTTP bodies) per step, each party's and the total*",
        "",
    ]
    if gap is not None:
        lines += [f"- {target['what']}: gap {gap:+.4f}: {verdict}.", ""]
    lines += [
        "| task | parties | method | seeds | metric | value | gap to N = 1 | up B/step per party "
        "| down B/step per party | up B/step total | down B/step total |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["summary"]:
        metric = next(r["metric"] for r in doc["records"] if r["task"] == row["task"])
        spread = f" ± {row['std']:.4f}" if row["std"] is not None else ""
        gap_text = "–" if row["parties"] == 1 else f"{row['gap_to_one_party']:+.4f}"
        per = row["bytes_per_step"]
        ups = " / ".join(f"{name} {b['up_per_step']:,.0f}" for name, b in per.items())
        downs = " / ".join(f"{name} {b['down_per_step']:,.0f}" for name, b in per.items())
        lines.append(
            f"| {row['task']} | {row['parties']} | {row['method']} | {row['seeds']} | {metric} "
            f"| {row['mean']:.4f}{spread} | {gap_text} | {ups} | {downs} "
            f"| {row['up_per_step']:,.0f} | {row['down_per_step']:,.0f} |"
        )
    return lines


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return float(sum(r[key] for r in runs) / len(runs))


def render() -> str:
    out: list[str] = []
    sections = [
        ("The per-step floor (issue 27)", "floor", floor_table),
        ("Where a step's time goes (issue 27)", "floor", floor_breakdown_table),
        (
            "Small steps under locust, before and after (issue 27)",
            "floor-locust",
            floor_locust_table,
        ),
        (
            "The per-step floor, one party B for N feature parties against 08408bb (issue 32)",
            "floor-one-path",
            floor_table,
        ),
        (
            "Where a step's time goes, one party B for N feature parties (issue 32)",
            "floor-one-path",
            floor_breakdown_table,
        ),
        (
            "The per-step floor, the step path cut against 9795eb6 (issue 36)",
            "floor-step-path",
            floor_table,
        ),
        (
            "Where a step's time goes, the step path cut (issue 36)",
            "floor-step-path",
            floor_breakdown_table,
        ),
        (
            "Small steps under locust, the step path cut against f352584 (issue 36)",
            "floor-locust-step-path",
            floor_locust_table,
        ),
        (
            "The per-step floor, the lean step path against f05532c (issue 36, second round)",
            "floor-lean-path",
            floor_table,
        ),
        (
            "Where a step's time goes, the lean step path (issue 36, second round)",
            "floor-lean-path",
            floor_breakdown_table,
        ),
        (
            "Small steps under locust against f352584, each version as it installs (issue 36)",
            "floor-locust-declared",
            floor_locust_table,
        ),
        (
            "Small steps under locust against f352584, both on uvloop (issue 36, second round)",
            "floor-locust-lean-path",
            floor_locust_table,
        ),
        (
            "Small steps under locust against f352584, steps matched first (issue 36, third round)",
            "floor-locust-routes",
            floor_locust_table,
        ),
        (
            "The per-step floor, dependencies on the event loop against efa9d4c (issue 36, "
            "fourth round)",
            "floor-async-deps",
            floor_table,
        ),
        (
            "Where a step's time goes, dependencies on the event loop (issue 36, fourth round)",
            "floor-async-deps",
            floor_breakdown_table,
        ),
        (
            "The per-step floor, dependencies on the event loop against efa9d4c, second run "
            "(issue 36, fourth round)",
            "floor-async-deps-cpu",
            floor_table,
        ),
        (
            "Where a step's time goes, dependencies on the event loop, second run, with party "
            "B's CPU (issue 36, fourth round)",
            "floor-async-deps-cpu",
            floor_breakdown_table,
        ),
        (
            "Small steps under locust against f352584, dependencies on the event loop (issue "
            "36, fourth round)",
            "floor-locust-async-deps",
            floor_locust_table,
        ),
        (
            "Small steps under locust against f352584, dependencies on the event loop, "
            "second run (issue 36, fourth round)",
            "floor-locust-async-deps-2",
            floor_locust_table,
        ),
        ("Party B's HTTP path, layer by layer (issue 36)", "http_path", http_path_table),
        (
            "Party B's HTTP path, layer by layer, at efa9d4c: the route's dependencies in "
            "worker threads (issue 36, fourth round)",
            "http_path-efa9d4c",
            http_path_table,
        ),
        ("Quantizer, all libraries on one thread", "quantizer-1thread", quantizer_table),
        ("Quantizer, default threads", "quantizer", quantizer_table),
        ("Codec", "codec", codec_table),
        ("One training step at the FEMNIST shape", "step", step_table),
        ("Party B throughput under locust", "throughput-femnist-fedlite", throughput_table),
        (
            "Party B throughput under locust, party B on one torch thread",
            "throughput-femnist-fedlite-1thread",
            throughput_table,
        ),
        ("Memory", "memory", memory_tables),
        ("Party B's runs in memory, bounded", "memory-bounded", memory_bounded_table),
        ("Party B replicas behind HAProxy under locust", "replicas", replicas_table),
        ("Deriving the split and the batches (schedule versions)", "schedule", schedule_table),
        ("Traffic both ways, and accuracy, per representation", "traffic", traffic_table),
        ("Across a WAN (namespaces, tbf, latency proxy)", "wan", wan_table),
        ("Accuracy against pipeline depth K", "staleness", staleness_table),
        ("On a GPU (benchmarks/device_check.py)", "device_check", device_check_tables),
        (
            "First contact: start-up, alignment bytes, the first lines",
            "first_contact",
            first_contact_table,
        ),
        ("Several feature parties against one holding every feature", "parties", parties_table),
        ("Scoring a whole table (issue 34)", "scoring", scoring_table),
        ("A 1,000,000 × 100 Parquet table prepared (issue 35)", "tables", preparation_table),
    ]
    one, default = _load("quantizer-1thread"), _load("quantizer")
    if one is not None:
        out += ["### Quantizer against faiss (issue 17's target)", ""]
        out += quantizer_target_table(one, default) + [""]
    for title, name, table in sections:
        doc = _load(name)
        out += [f"### {title}", ""]
        if doc is None:
            out = out[:-2]  # optional sections are left out until their file exists
            continue
        out += table(doc)
        out.append("")
    return "\n".join(out)


def main() -> None:
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n\n" + render() + "\n" + text[stop:])
    print(f"updated {DOC}")


if __name__ == "__main__":
    main()
