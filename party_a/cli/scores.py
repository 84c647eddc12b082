"""Where ``fedlite-a predict`` writes scores: as each request's answer comes, resumably.

With ``--out FILE`` the rows go to ``FILE.partial`` (CSV) while scoring, and
``FILE.partial.json`` records the job (party B, the run and its model step, a digest of the
ids in order, ``--raw``) and how many rows and bytes of the partial file are complete. It is
written after each request's rows are flushed to disk, so after an interruption (a crash,
Ctrl-C, party B gone for longer than ``--retry-for``) the same command carries on after the
last complete request, and what a killed process wrote past it is cut off. A partial file of
another job (other ids, another model step) is started over. At the end the partial file is
renamed to ``FILE`` (CSV), or converted to Parquet when ``FILE`` ends in ``.parquet``, and the
record removed. Without ``--out`` the rows stream to stdout (nothing to resume).

A CSV has the table's id column name first and ``score_0 .. score_{C-1}`` with six decimals,
as before; a Parquet file the same columns, the ids as strings and the scores as float32.
"""

import csv
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["ScoreSink", "columns_line", "ids_digest", "open_sink", "progress"]


def ids_digest(ids: Sequence[str]) -> str:
    """SHA-256 of the ids in order, one per line: which list a partial file belongs to."""
    digest = hashlib.sha256()
    for i in ids:
        digest.update(i.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def columns_line(classes: Sequence[str] | None) -> str | None:
    """What each score column is, from party B's classes in score order (``RunOut.classes``):
    ``score_0 = 'bad', score_1 = 'good' (positive class: 'good')``; None where party B names
    none."""
    if not classes:
        return None
    named = ", ".join(f"score_{i} = {c!r}" for i, c in enumerate(classes))
    return f"{named} (positive class: {classes[1]!r})" if len(classes) == 2 else named


class ScoreSink:
    """Rows of scores, appended in id order; ``done`` rows were there already (resumed)."""

    def __init__(self, stream: IO[str], *, id_column: str, parquet: bool) -> None:
        self._stream = stream
        self._id_column = id_column
        self._format = "{:.9g}" if parquet else "{:.6f}"  # Parquet: float32 exactly
        self.done = 0
        self.header_written = False

    def write(self, ids: Sequence[str], scores: np.ndarray) -> None:
        """Append one answer's rows (and the header before the first)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if not self.header_written:
            writer.writerow([self._id_column, *[f"score_{c}" for c in range(scores.shape[1])]])
            self.header_written = True
        fmt = self._format.format
        for i, row in zip(ids, scores.tolist(), strict=True):
            writer.writerow([i, *[fmt(v) for v in row]])
        self._stream.write(buffer.getvalue())
        self._stream.flush()
        self.done += len(ids)
        self.committed()

    def committed(self) -> None:
        """Called once a request's rows are written (the file sink records its progress)."""


class _FileSink(ScoreSink):
    """``out.partial`` and its record ``out.partial.json``; ``finish`` makes ``out``."""

    def __init__(self, out: Path, job: dict[str, Any], *, id_column: str) -> None:
        self.out = out
        self.partial = out.with_name(out.name + ".partial")
        self.record = out.with_name(out.name + ".partial.json")
        self.job = job
        kept = self._resumable()
        stream = open(self.partial, "r+" if kept else "w", newline="")  # noqa: SIM115
        super().__init__(stream, id_column=id_column, parquet=_is_parquet(out))
        if kept:
            rows, size = kept
            stream.truncate(size)  # what a killed process wrote past its last record
            stream.seek(size)
            self.done, self.header_written = rows, size > 0
        else:
            self.committed()

    def _resumable(self) -> tuple[int, int] | None:
        """(rows, bytes) complete in a partial file of this same job, else None."""
        try:
            record = json.loads(self.record.read_text())
            size = self.partial.stat().st_size
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("job") != self.job:
            return None
        rows, complete = record.get("rows"), record.get("bytes")
        if not isinstance(rows, int) or not isinstance(complete, int) or complete > size:
            return None
        return rows, complete

    def committed(self) -> None:
        os.fsync(self._stream.fileno())
        record = {"job": self.job, "rows": self.done, "bytes": self._stream.tell()}
        temporary = self.record.with_name(self.record.name + ".tmp")
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.record)

    def finish(self) -> None:
        self._stream.close()
        if _is_parquet(self.out):
            _csv_to_parquet(self.partial, self.out)
            self.partial.unlink()
        else:
            os.replace(self.partial, self.out)
        self.record.unlink()

    def close(self) -> None:
        self._stream.close()


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() == ".parquet"


def _csv_to_parquet(source: Path, target: Path) -> None:
    """Stream the partial CSV into a Parquet file (ids as strings, scores as float32)."""
    import pyarrow as pa
    from pyarrow import csv as pa_csv
    from pyarrow import parquet as pq

    with source.open(newline="") as stream:
        header = next(csv.reader(stream))
    types = {name: pa.float32() for name in header[1:]} | {header[0]: pa.string()}
    reader = pa_csv.open_csv(source, convert_options=pa_csv.ConvertOptions(column_types=types))
    temporary = target.with_name(target.name + ".tmp")
    with pq.ParquetWriter(temporary, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)
    os.replace(temporary, target)


@contextmanager
def open_sink(out: Path | None, job: dict[str, Any], *, id_column: str) -> Iterator[ScoreSink]:
    """Where the scores go: ``out`` (resumable, finished only when every row is written) or
    stdout."""
    if out is None:
        yield ScoreSink(sys.stdout, id_column=id_column, parquet=False)
        return
    sink = _FileSink(out, job, id_column=id_column)
    try:
        yield sink
    except BaseException:
        sink.close()  # the partial file and its record stay, for the next run to resume
        raise
    sink.finish()


@contextmanager
def progress(console: Any, *, total: int, done: int) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(ids)``: a live bar on a terminal, else a line at every ~10%."""
    if console.is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("scored"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("ids"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        with bar:
            task = bar.add_task("scoring", total=total, completed=done)
            yield lambda ids: bar.advance(task, ids)
        return
    every = max(1, total // 10)
    state = {"done": done, "shown": done}

    def advance(ids: int) -> None:
        state["done"] += ids
        if state["done"] - state["shown"] >= every or state["done"] == total:
            console.print(f"scored {state['done']:,} / {total:,} ids")
            state["shown"] = state["done"]

    yield advance
