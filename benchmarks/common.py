"""Shared helpers of the benchmark scripts: timing, machine description, result files, and
the formats the generated tables share.

Every benchmark writes one JSON file under ``benchmarks/results/`` with the machine, library
versions, the load average before and after (the machine is shared, so every figure must be
read next to it) and medians over repeats. Targets are ratios of figures measured in the
same run, never absolute times.
"""

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(
    os.environ.get("FEDLITE_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
)
TOKEN = "benchmark-token-0123456789"


@contextmanager
def party_b_server(
    data_dir: Path,
    labels: Path,
    *,
    malloc_tuning: bool = True,
    torch_threads: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """``fedlite-b serve`` on 127.0.0.1 with TOKEN (and the glibc malloc settings of
    docs/PERFORMANCE.md unless ``malloc_tuning`` is off); yields its URL."""
    from party_b.ops.launch import MALLOC_TUNING, local_party_b  # here: benchmarks import no party

    extra = ["--torch-threads", str(torch_threads)] if torch_threads else []
    extra += list(extra_args)
    env = MALLOC_TUNING if malloc_tuning else {}
    with local_party_b(data_dir, labels, {"benchmark": TOKEN}, extra_args=extra, env=env) as url:
        yield url


def versions(*packages: str) -> dict[str, str | None]:
    """Installed version of each distribution (None when it is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def timed(fn: Callable[[], object], repeats: int, *, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary_ms(seconds: list[float]) -> dict[str, float]:
    """Median, quartiles and minimum in milliseconds."""
    ms = sorted(1000 * s for s in seconds)
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return {
        "median_ms": statistics.median(ms),
        "p25_ms": q[0],
        "p75_ms": q[2],
        "min_ms": ms[0],
        "n": len(ms),
    }


def _command() -> str:
    """How this benchmark was started, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    if script.is_relative_to(root) and script.suffix == ".py":
        parts = script.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__":  # python -m benchmarks.floor runs benchmarks/floor/__main__.py
            parts = parts[:-1]
        return " ".join(["python", "-m", ".".join(parts), *sys.argv[1:]])
    return " ".join(["python", *sys.argv])


def write_result(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` (or ``out``) with the standard header."""
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "command": _command(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def format_ms(x: float | None) -> str:
    """A time (ms, or any figure of that size) as the tables print it: two decimals below 10,
    one below 100, none above; a dash when it was not measured."""
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def load_note(doc: dict[str, Any]) -> str:
    """When a result was measured and the machine's state: load average before and after,
    CPUs, torch threads."""
    before = doc.get("loadavg_before", [0])[0]
    after = doc.get("loadavg_after", [0])[0]
    return (
        f"{doc['when']}, load average {before:.1f} → {after:.1f} on {doc['machine']['cpus']} "
        f"CPUs, torch threads {doc['machine']['torch_threads']}"
    )
