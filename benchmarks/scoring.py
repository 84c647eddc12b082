"""Whole-table scoring (issue 34): ``fedlite-a predict --ids-file`` of every id of a table,
time and peak memory of each party.

    python -m benchmarks.scoring                       # default_credit, then 1,000,000 ids
    python -m benchmarks.scoring --synthetic 200000    # a smaller synthetic table
    python -m benchmarks.scoring --skip-synthetic

Two tables, each served by a fresh ``fedlite-b serve`` (default settings: 16,384 ids a request
at most, label privacy ``protected``) and scored by ``fedlite-a`` as processes, as a bank
would run them:

* FATE's default_credit pair (``../shared/data/fate_hetero``): party A the host's 10
  columns, party B the guest's label and 13 columns, 30,000 ids each side; a 100-step run
  trained first, then all 30,000 ids scored;
* a synthetic table of ``--synthetic`` ids (default 1,000,000), seeded: party A 10 normal
  columns, party B 3 columns and a label for the first 50,000 ids only (the customers with
  a history, which the run trains on), every other label empty (customers party B serves but
  cannot train on); a 50-step run trained first, then every id scored.

Per table: the seconds of ``fedlite-a predict`` (the process, start to exit) and of its
scoring (from its "scoring ... ids" line to its exit), ids per second, party A's peak
resident memory (the predict process's ``ru_maxrss``) and party B's during the scoring
(its ``VmHWM``, reset just before through ``/proc/PID/clear_refs``; needs that file writable,
else the peak of the whole process life is reported and marked so), and party B's resident
memory before it. The private set intersection runs during training and is cached by party
A, as for any later scoring of the same table. Writes ``benchmarks/results/scoring.json``;
``python -m benchmarks.report`` renders it into docs/PERFORMANCE.md.
"""

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, SHARED_DATA, TOKEN, load_note, versions, write_result

__all__ = ["main", "scoring_table"]

PAIR = SHARED_DATA / "fate_hetero"
HISTORY = 50_000  # labeled rows of the synthetic table

CONFIG = """\
[run]
name = "{name}"
model = "tabular_mlp"
steps = {steps}
batch_size = 256
checkpoint_interval = 50
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


def _env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    return {**clean, "PYTHONPATH": str(ROOT)}


# ---------------------------------------------------------------------------- the tables


def default_credit(work: Path) -> tuple[Path, Path]:
    """(party A's features, party B's labels): FATE's pair as plain CSVs in ``work``."""
    out = []
    for side, name in (("host", "features.csv"), ("guest", "labels.csv")):
        with gzip.open(PAIR / f"default_credit_hetero_{side}.csv.gz", "rb") as source:
            with (work / name).open("wb") as target:
                shutil.copyfileobj(source, target)
        out.append(work / name)
    return out[0], out[1]


def synthetic(work: Path, n: int, *, labeled: int = HISTORY, seed: int = 0) -> tuple[Path, Path]:
    """(party A's features, party B's labels) of ``n`` seeded ids; labels for the first
    ``labeled`` only."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    ids = [f"c{i:08d}" for i in range(n)]
    x = rng.standard_normal((n, 10)).astype(np.float32)
    side = rng.standard_normal((n, 3)).astype(np.float32)
    signal = x[:, :5].sum(axis=1) + side[:, 0] + rng.standard_normal(n).astype(np.float32)
    label = pd.array((signal > 0).astype(np.int64), dtype="Int64")
    label[min(labeled, n) :] = pd.NA
    features = pd.DataFrame({"id": ids, **{f"f{j}": x[:, j] for j in range(10)}})
    labels = pd.DataFrame({"id": ids, "y": label, **{f"b{j}": side[:, j] for j in range(3)}})
    features.to_csv(work / "features.csv", index=False, float_format="%.5f")
    labels.to_csv(work / "labels.csv", index=False, float_format="%.5f")
    return work / "features.csv", work / "labels.csv"


# ---------------------------------------------------------------------------- the parties


@contextmanager
def party_b(data_dir: Path, labels: Path) -> Iterator[tuple[str, int]]:
    """``fedlite-b serve`` on a free port, the token in its environment; (URL, pid)."""
    from party_b.ops.launch import child_process, free_port, wait_until_healthy

    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve", "--port", str(port),
        "--data-dir", str(data_dir), "--labels", str(labels), "--log-level", "warning",
    ]  # fmt: skip
    env = {**_env(), "FEDLITE_B_TOKENS": f"benchmark:{TOKEN}"}
    log = data_dir / "party_b.log"
    with child_process(cmd, log, env=env, cwd=ROOT) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, proc, log_path=log, timeout=600)
        yield url, proc.pid


def _party_a(command: str, url: str, features: Path, state: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "party_a.cli", command, "--server", url,
        "--features", str(features), "--state-dir", str(state), *extra,
    ]  # fmt: skip


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _reset_peak(pid: int) -> bool:
    """Reset the process's peak resident set (VmHWM); False where the kernel refuses."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _run(cmd: list[str], log: Path) -> dict[str, Any]:
    """``cmd`` as a process: wall seconds, peak RSS (its own rusage), stderr lines timed."""
    env = {**_env(), "FEDLITE_A_TOKEN": TOKEN}
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - started, line.rstrip()))
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    log.write_text("\n".join(f"{s:8.2f} {text}" for s, text in lines) + "\n")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} exited {proc.returncode}: see {log}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "lines": lines}


def measure(name: str, features: Path, labels: Path, work: Path, steps: int) -> dict[str, Any]:
    """Train a run on the pair, then score every id of the feature table with ``--ids-file``."""
    config = work / "run.toml"
    config.write_text(CONFIG.format(name=name, steps=steps))
    state = work / "a"
    ids_file = work / "ids.txt"
    with features.open() as table:
        next(table)
        ids_file.write_text("".join(line.split(",", 1)[0] + "\n" for line in table))
    ids = sum(1 for _ in ids_file.open())
    out = work / "scores.csv"
    with party_b(work / "b", labels) as (url, pid):
        print(f"{name}: training {steps} steps on {ids:,} ids", file=sys.stderr)
        trained = _run(
            _party_a("train", url, features, state, "--config", str(config)), work / "train.log"
        )
        rss_before = _status_kb(pid, "VmRSS") / 1024
        reset = _reset_peak(pid)
        print(f"{name}: scoring {ids:,} ids", file=sys.stderr)
        predict = _party_a(
            "predict", url, features, state, "--name", name, "--ids-file", str(ids_file),
            "--out", str(out),
        )  # fmt: skip
        scored = _run(predict, work / "predict.log")
        party_b_peak = _status_kb(pid, "VmHWM") / 1024
    rows = sum(1 for _ in out.open()) - 1
    began = next(s for s, text in scored["lines"] if "scoring " in text and " ids" in text)
    scoring_s = scored["seconds"] - began
    return {
        "table": name,
        "ids": ids,
        "scores_written": rows,
        "train_s": round(trained["seconds"], 1),
        "predict_s": round(scored["seconds"], 1),
        "scoring_s": round(scoring_s, 1),
        "ids_per_s": round(ids / scoring_s),
        "party_a_peak_rss_mb": round(scored["peak_rss_mb"]),
        "party_b_rss_before_mb": round(rss_before),
        "party_b_peak_rss_mb": round(party_b_peak),
        "party_b_peak_is_lifetime": not reset,
        "output_mb": round(out.stat().st_size / 2**20, 1),
        "predict_lines": [
            [round(s, 2), text.replace(str(work), "<tmp>")] for s, text in scored["lines"]
        ][-8:],
    }


# ---------------------------------------------------------------------------- report


def scoring_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"*{load_note(doc)}; `{doc['command']}`*",
        "",
        "| table | ids | scores written | `predict` s (scoring s) | ids/s | party A peak RSS MB "
        "| party B RSS before → peak while scoring MB | output MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in doc["cases"]:
        peak = f"{case['party_b_peak_rss_mb']:,}" + (
            " (process lifetime)" if case["party_b_peak_is_lifetime"] else ""
        )
        lines.append(
            f"| {case['table']} | {case['ids']:,} | {case['scores_written']:,} "
            f"| {case['predict_s']} ({case['scoring_s']}) | {case['ids_per_s']:,} "
            f"| {case['party_a_peak_rss_mb']:,} | {case['party_b_rss_before_mb']:,} → {peak} "
            f"| {case['output_mb']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scoring", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--synthetic", type=int, default=1_000_000, help="ids of the big table")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-default-credit", action="store_true")
    parser.add_argument("--out", type=Path, help="result file (default results/scoring.json)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    cases = []
    with tempfile.TemporaryDirectory(prefix="scoring-") as tmp:
        if not args.skip_default_credit:
            if not PAIR.is_dir():
                sys.exit(f"no FATE data at {PAIR} (set FEDLITE_SHARED_DATA)")
            work = Path(tmp) / "default_credit"
            work.mkdir()
            features, labels = default_credit(work)
            cases.append(measure("default_credit", features, labels, work, steps=100))
            print(cases[-1], file=sys.stderr)
        if not args.skip_synthetic:
            work = Path(tmp) / "synthetic"
            work.mkdir()
            print(f"writing the synthetic table of {args.synthetic:,} ids", file=sys.stderr)
            features, labels = synthetic(work, args.synthetic)
            name = f"synthetic-{args.synthetic}"
            cases.append(measure(name, features, labels, work, steps=50))
            print(cases[-1], file=sys.stderr)
    result = {
        "cases": cases,
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "versions": versions("torch", "numpy", "fastapi", "uvicorn"),
    }
    print(write_result("scoring", result, args.out))


if __name__ == "__main__":
    main()
