"""First contact: how long ``fedlite-a`` commands take to start, what the alignment costs on
the wire, and when a new user's first ``train`` first says something.

    python -m benchmarks.first_contact [--baseline-root DIR] [--repeats 5]

Three measurements, on FATE's default_credit pair (``../shared/data/fate_hetero``, 30,000
ids each side), cut to about the issue's sizes: party A keeps 29,200 ids, party B 29,600
(seeded), so that the intersection is about 28,800:

* ``startup``: wall seconds of ``fedlite-a --help``, ``runs`` (an empty state), ``check``
  (against a live party B) and ``fedlite-b --help``, each a fresh ``python -m`` process,
  median of ``--repeats``;
* ``alignment_bytes``: the bodies of one PSI (request and reply) and of aligning a run on its
  intersection, both ways: the JSON alignment (``POST /v1/runs/{id}/alignment``, hex keys, what
  every party A sent before) and the binary one (``.../alignment/keys``, docs/PROTOCOL.md 8.1),
  counted by party A's HTTP client against ``fedlite-b serve``;
* ``timeline``: ``fedlite-a train`` (20 steps) started the moment a fresh ``fedlite-b serve``
  answers ``/healthz``: the seconds (from the command's launch) of each line it writes before
  the first step, and the line that says training began. With ``--baseline-root`` (another
  checkout, e.g. the release before), the same run of that checkout's two CLIs comes first.

Writes ``benchmarks/results/first_contact.json``; ``python -m benchmarks.report`` renders it
into docs/PERFORMANCE.md.
"""

import argparse
import gzip
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, SHARED_DATA, TOKEN, versions, write_result

PAIR = SHARED_DATA / "fate_hetero"
A_IDS, B_IDS = 29_200, 29_600
CONFIG = """\
[run]
name = "{name}"
model = "tabular_mlp"
steps = 20
batch_size = 64
checkpoint_interval = 10
eval_fraction = 0.2

[model.bottom]
hidden = [32]
cut_dim = 16

[model.top]
hidden = [16]

[quantizer]
mode = "pq"
q = 4
L = 4
"""


# ---------------------------------------------------------------------------- data


def _subset(source: Path, out: Path, keep: int, seed: int) -> Path:
    """``keep`` rows of a gzipped CSV (header kept), chosen with ``seed``, as a plain CSV."""
    with gzip.open(source, "rt") as handle:
        header, *rows = handle.read().splitlines()
    chosen = sorted(random.Random(seed).sample(range(len(rows)), keep))
    out.write_text("\n".join([header, *(rows[i] for i in chosen)]) + "\n")
    return out


def tables(directory: Path) -> tuple[Path, Path]:
    """(party A's features, party B's labels) at the issue's sizes."""
    features = _subset(PAIR / "default_credit_hetero_host.csv.gz", directory / "a.csv", A_IDS, 1)
    labels = _subset(PAIR / "default_credit_hetero_guest.csv.gz", directory / "b.csv", B_IDS, 2)
    return features, labels


# ---------------------------------------------------------------------------- processes


def _env(root: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    return {**clean, "PYTHONPATH": str(root)}


def _seconds(cmd: list[str], root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, timeout=300, check=False)
    return time.perf_counter() - started


def startup(url: str, repeats: int, state: Path) -> dict[str, Any]:
    """Median wall seconds of each command as a fresh process (imports included)."""
    a = [sys.executable, "-m", "party_a.cli"]
    commands = {
        "fedlite-a --help": [*a, "--help"],
        "fedlite-a runs": [*a, "runs", "--state-dir", str(state)],
        "fedlite-a check": [*a, "check", "--server", url, "--token", TOKEN],
        "fedlite-b --help": [sys.executable, "-m", "party_b.ops.cli", "--help"],
    }
    out = {}
    for name, cmd in commands.items():
        _seconds(cmd, ROOT)  # warm the page cache
        times = sorted(_seconds(cmd, ROOT) for _ in range(repeats))
        out[name] = {"median_s": times[len(times) // 2], "min_s": times[0], "n": len(times)}
        print(f"{name}: {out[name]['median_s']:.2f} s", file=sys.stderr)
    return out


class PartyB:
    """``fedlite-b serve`` of the checkout ``root`` on a free port, logging at info."""

    def __init__(self, root: Path, data_dir: Path, labels: Path) -> None:
        with socket.socket() as probe:  # a free 127.0.0.1 port
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = data_dir / "party_b.log"
        cmd = [
            sys.executable, "-m", "party_b.ops.cli", "serve", "--port", str(self.port),
            "--data-dir", str(data_dir), "--labels", str(labels), "--tokens",
            f"benchmark:{TOKEN}", "--log-level", "info",
        ]  # fmt: skip
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=root, env=_env(root), stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        import httpx

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"party B exited:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        self.healthy_after = time.monotonic() - self.launched

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def timeline(root: Path, features: Path, labels: Path, work: Path) -> dict[str, Any]:
    """``fedlite-a train`` of ``root`` right after ``root``'s party B came up."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "run.toml"
    config.write_text(CONFIG.format(name="first-contact"))
    party_b = PartyB(root, work / "b", labels)
    lines: list[tuple[float, str]] = []
    try:
        cmd = [
            sys.executable, "-m", "party_a.cli", "train", "--server", party_b.url,
            "--token", TOKEN, "--features", str(features), "--config", str(config),
            "--state-dir", str(work / "a"), "--summary-json", str(work / "summary.json"),
        ]  # fmt: skip
        launched = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=root, env=_env(root), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        assert proc.stderr is not None

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic() - launched, line.rstrip()))

        reader = threading.Thread(target=read)
        reader.start()
        code = proc.wait(timeout=1800)
        reader.join()
        total = time.monotonic() - launched
    finally:
        party_b.stop()
    if code != 0:
        raise RuntimeError(f"train exited {code}:\n" + "\n".join(t for _s, t in lines))
    summary = json.loads((work / "summary.json").read_text())
    first_step = next(s for s, t in lines if t.startswith("step 1/"))  # the progress line

    def clean(text: str) -> str:  # no machine paths in the results
        return text.replace(str(work.parent), "<tmp>")

    return {
        "party_b_healthy_after_s": round(party_b.healthy_after, 2),
        "first_line_s": round(lines[0][0], 2),
        "first_step_s": round(first_step, 2),
        "total_s": round(total, 2),
        "lines": [[round(s, 2), clean(text)] for s, text in lines if s <= first_step][:20],
        "alignment_bytes": summary.get("alignment_bytes"),
        "http_bytes_sent": summary.get("http_bytes_sent"),
        "http_bytes_received": summary.get("http_bytes_received"),
        "party_b_log": [
            clean(line)
            for line in party_b.log.read_text().splitlines()
            if "fedlite.party_b" in line
        ][:12],
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose first step came at the median time, with every run's timings."""
    ordered = sorted(runs, key=lambda r: r["first_step_s"])
    median = dict(ordered[len(ordered) // 2])
    median["all_runs"] = [
        {k: r[k] for k in ("first_line_s", "first_step_s", "total_s")} for r in runs
    ]
    return median


# ---------------------------------------------------------------------------- bytes


def alignment_bytes(url: str, features: Path, work: Path) -> dict[str, Any]:
    """Bodies of one PSI and of aligning two runs on its intersection: JSON, then binary."""
    from api_schemas import RunCreate
    from party_a.alignment import private_intersection
    from party_a.session import open_state
    from party_a.transport.http import HttpTransport
    from shared.alignkeys import decode_align_reply, encode_align_request, request_for
    from shared.alignment import hmac_ids
    from shared.idtables import read_id_table

    ids = read_id_table(features, id_column="id").ids
    store = open_state(work / "bytes-state", create=True)
    spec = RunCreate.model_validate(
        {
            "name": "bytes",
            "model": "tabular_mlp",
            "top": {"hidden": [16]},
            "cut_dim": 16,
            "quantizer": {"mode": "pq", "q": 4, "L": 4},
            "optimizer": {"name": "adam", "lr": 0.001},
            "seed": 0,
            "batch_size": 64,
            "steps": 20,
        }  # fmt: skip
    )
    out: dict[str, Any] = {}
    with HttpTransport(url, TOKEN) as transport:
        before = transport.bytes_sent, transport.bytes_received
        psi, _cached = private_intersection(ids, transport=transport, store=store, server=url)
        out["psi"] = {
            "ids_here": len(ids),
            "common": len(psi.intersection),
            "sent": transport.bytes_sent - before[0],
            "received": transport.bytes_received - before[1],
        }
        for fmt in ("json", "keys"):
            run = transport.create_run(spec.model_copy(update={"name": f"bytes-{fmt}"}))
            offered = hmac_ids(bytes.fromhex(run.alignment_key), psi.intersection)
            before = transport.bytes_sent, transport.bytes_received
            if fmt == "json":
                aligned = len(transport.align(run.id, [k.hex() for k in offered]).intersection)
            else:
                body = encode_align_request(request_for(offered)[0])
                aligned = decode_align_reply(transport.align_keys(run.id, body)).count
            out[fmt] = {
                "aligned": aligned,
                "sent": transport.bytes_sent - before[0],
                "received": transport.bytes_received - before[1],
            }
    store.close()
    for part in ("psi", "json", "keys"):
        out[part]["total"] = out[part]["sent"] + out[part]["received"]
    out["first_contact_before"] = out["psi"]["total"] + out["json"]["total"]
    out["first_contact_after"] = out["psi"]["total"] + out["keys"]["total"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each start-up command")
    parser.add_argument(
        "--timelines", type=int, default=3, help="first-contact runs of each checkout"
    )
    parser.add_argument("--baseline-root", type=Path, help="another checkout to time first")
    parser.add_argument(
        "--baseline-label", default="another checkout", help="what --baseline-root is (recorded)"
    )
    args = parser.parse_args()
    if not PAIR.is_dir():
        sys.exit(f"no FATE data at {PAIR} (set FEDLITE_SHARED_DATA)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        work = Path(tmp)
        features, labels = tables(work)
        result: dict[str, Any] = {"sizes": {"party_a_ids": A_IDS, "party_b_ids": B_IDS}}
        roots = {"current": ROOT}
        if args.baseline_root is not None:
            roots = {"baseline": args.baseline_root.resolve(), **roots}
        runs: dict[str, list[dict[str, Any]]] = {key: [] for key in roots}
        for i in range(args.timelines):  # interleaved: the checkouts share the machine's noise
            for key, root in roots.items():
                runs[key].append(timeline(root, features, labels, work / f"{key}-{i}"))
        for key, timed in runs.items():
            result[key] = _median_run(timed)
        from party_a.session import open_state

        open_state(work / "empty-state", create=True).close()
        party_b = PartyB(ROOT, work / "serving", labels)
        try:
            result["alignment_bytes"] = alignment_bytes(party_b.url, features, work)
            result["startup"] = startup(party_b.url, args.repeats, work / "empty-state")
        finally:
            party_b.stop()
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["versions"] = versions("torch", "httpx", "openmined.psi")
    # the command as run, with the baseline named rather than its path on this machine
    result["command"] = "python -m benchmarks.first_contact" + (
        f" --baseline-root <{args.baseline_label}>" if args.baseline_root else ""
    )
    if args.baseline_root is not None:
        result["baseline"]["label"] = args.baseline_label
    print(write_result("first_contact", result))


if __name__ == "__main__":
    main()
