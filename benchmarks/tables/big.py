"""A 1,000,000-row x 100-column Parquet table prepared with bounded memory.

    python -m benchmarks.tables big [--rows 1000000]

The table (written once to a temporary directory, a row group at a time): 84 number
columns, 8 of them with 2 % empty cells; 12 categorical columns of 3 to 40 values (3 with
empty cells); 2 id-like text columns of 100,000 distinct values; 2 boolean columns. In a
fresh child process, party A's own path prepares it: ``load_features`` (Parquet read a
batch of 65,536 rows at a time, numbers into one float32 matrix allocated once, text
dictionary-encoded), ``FeatureTransform.fit`` on a seeded 80 % of the rows (as a run's
training rows), and ``apply`` to every row. Measured: the seconds of each phase and the
child's peak resident memory (``ru_maxrss``), next to the sizes that bound it (the float32
table as read, and the prepared matrix). For reference, another fresh child reads the same
file whole with ``pandas.read_parquet``, the way tables were read before (its peak alone).
"""

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["measure", "write_table"]

ROW_GROUP = 100_000
NUMBERS, SPARSE, CATEGORIES, IDS, FLAGS = 84, 8, 12, 2, 2


def write_table(path: Path, rows: int, seed: int = 0) -> dict[str, Any]:
    """Write the benchmark's table to ``path`` a row group at a time; its shape."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    small = [[f"v{j}_{k}" for k in range(3 + 3 * j)] for j in range(CATEGORIES)]
    ids = np.array([f"id{k:06d}" for k in range(100_000)], dtype=object)
    writer = None
    for start in range(0, rows, ROW_GROUP):
        n = min(ROW_GROUP, rows - start)
        columns: dict[str, Any] = {"id": pa.array([f"r{start + i:07d}" for i in range(n)])}
        for j in range(NUMBERS):
            values = rng.standard_normal(n) * (j + 1) + j
            mask = rng.random(n) < 0.02 if j < SPARSE else None
            columns[f"n{j:02d}"] = pa.array(values, mask=mask)
        for j, vocabulary in enumerate(small):
            codes = rng.integers(0, len(vocabulary), n)
            mask = rng.random(n) < 0.01 if j < 3 else None
            columns[f"c{j:02d}"] = pa.array(np.array(vocabulary, dtype=object)[codes], mask=mask)
        for j in range(IDS):
            columns[f"key{j}"] = pa.array(ids[rng.integers(0, len(ids), n)])
        for j in range(FLAGS):
            columns[f"flag{j}"] = pa.array(rng.random(n) < 0.3)
        batch = pa.table(columns)
        if writer is None:
            writer = pq.ParquetWriter(path, batch.schema)
        writer.write_table(batch)
    assert writer is not None
    writer.close()
    return {
        "rows": rows,
        "columns": NUMBERS + CATEGORIES + IDS + FLAGS,
        "number_columns": NUMBERS,
        "categorical_columns": CATEGORIES + IDS + FLAGS,
        "file_mb": round(path.stat().st_size / 2**20, 1),
    }


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child_prepare(path: Path) -> dict[str, Any]:
    """Party A's preparation of the table at ``path``, timed phase by phase (this process)."""
    from party_a.features import FeatureTransform, load_features

    imported = _peak_mb()
    started = time.perf_counter()
    table = load_features(path, id_column="id", feature_columns=None, standardize=True)
    read = time.perf_counter()
    rows = np.sort(np.random.default_rng(0).permutation(len(table.ids))[: len(table.ids) * 4 // 5])
    transform = FeatureTransform.fit(table, rows)
    fitted = time.perf_counter()
    prepared = transform.apply(table)
    applied = time.perf_counter()
    return {
        "read_s": round(read - started, 2),
        "fit_s": round(fitted - read, 2),
        "apply_s": round(applied - fitted, 2),
        "total_s": round(applied - started, 2),
        "peak_rss_mb": round(_peak_mb(), 1),
        "rss_after_imports_mb": round(imported, 1),
        "table_float32_mb": round(table.x.nbytes / 2**20, 1),
        "prepared_mb": round(prepared.nbytes / 2**20, 1),
        "prepared_columns": int(prepared.shape[1]),
        "categories": transform.categories,
    }


def child_pandas(path: Path) -> dict[str, Any]:
    """The whole file as one pandas frame (what reading a table was before batches)."""
    import pandas as pd

    imported = _peak_mb()
    started = time.perf_counter()
    frame = pd.read_parquet(path)
    seconds = time.perf_counter() - started
    return {
        "read_s": round(seconds, 2),
        "peak_rss_mb": round(_peak_mb(), 1),
        "rss_after_imports_mb": round(imported, 1),
        "frame_mb": round(frame.memory_usage(deep=True).sum() / 2**20, 1),
    }


def _in_child(kind: str, path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.tables", "big-child", kind, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(rows: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tables-big-") as tmp:
        path = Path(tmp) / "big.parquet"
        started = time.perf_counter()
        shape = write_table(path, rows)
        print(f"wrote {path} ({shape['file_mb']} MB) in {time.perf_counter() - started:.0f} s")
        prepared = _in_child("prepare", path)
        print(f"prepared: {prepared}")
        whole = _in_child("pandas", path)
        print(f"pandas.read_parquet: {whole}")
    return {"table": shape, "prepare": prepared, "pandas_read_parquet": whole}
