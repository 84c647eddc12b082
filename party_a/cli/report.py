"""What ``fedlite-a train`` shows: a progress bar (or log lines) and the closing summary.

Nothing here is shown before it is known: the bar's loss and ratio read "-" until the first
step of this session has come back, instead of a made-up ``loss 0.0000``; a loss party B's
label-privacy policy withholds (NaN on the wire, docs/PROTOCOL.md 4.2.2) reads "withheld by
party B", never ``nan``, which reads as a diverged run.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["WITHHELD", "human_bytes", "loss_text", "progress", "summary_rows"]

NOT_YET = "-"
WITHHELD = "withheld by party B"


def loss_text(loss: float | None) -> str:
    """A loss as the CLI shows it: four decimals, or why there is none."""
    if loss is None or math.isnan(loss):
        return WITHHELD  # the run's metrics policy (a diverged step is refused, never shown)
    return f"{loss:.4f}"


@contextmanager
def progress(console: Any, *, total: int, start: int) -> Iterator[Callable[[Any, Any], None]]:
    """Yields ``update(step_result, summary)``: a live bar on a terminal, else a line at
    every ~5% of the run (and at its last step)."""
    if console.is_terminal:
        with _bar(console, total=total, start=start) as update:
            yield update
        return

    every = max(1, total // 20)

    def report(result: Any, summary: Any) -> None:
        if result.step % every == 0 or result.step == total:
            console.print(
                f"step {result.step}/{total} loss {loss_text(result.loss)} "
                f"sent {human_bytes(summary.bytes_sent)} "
                f"({summary.compression:.0f}x less than SplitFed)"
            )

    yield report


@contextmanager
def _bar(console: Any, *, total: int, start: int) -> Iterator[Callable[[Any, Any], None]]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("sent {task.fields[sent]}"),
        TextColumn("{task.fields[ratio]}"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task(
        "train", total=total, completed=start, loss=NOT_YET, sent="0 B", ratio=NOT_YET
    )

    def update(result: Any, summary: Any) -> None:
        bar.update(
            task,
            completed=result.step,
            loss=loss_text(result.loss),
            sent=human_bytes(summary.bytes_sent),
            ratio=f"{summary.compression:.0f}x",
        )

    with bar:
        yield update


def summary_rows(
    summary: Any, metrics: dict[str, float], http: tuple[int, int]
) -> list[tuple[str, str]]:
    """The closing table: every byte that crossed, both ways, and the held-out metrics.

    ``http``: message bodies this process sent and received over HTTP, every call counted
    (PSI, alignment, steps, evaluation, finish; retries included).
    """
    rows: list[tuple[str, str]] = [
        ("run", summary.run_id),
        ("steps", f"{summary.last_step} / {summary.steps}"),
        ("last batch loss", loss_text(summary.last_loss)),
        ("uplink bytes (steps)", f"{summary.bytes_sent:,}"),
        ("SplitFed would send", f"{summary.raw_bytes:,}"),
        ("compression", f"{summary.compression:.1f}x"),
        ("downlink bytes (steps)", f"{summary.bytes_received:,}"),
        ("id alignment bytes", f"{summary.alignment_bytes:,}"),
        ("all HTTP bodies sent", f"{http[0]:,}"),
        ("all HTTP bodies received", f"{http[1]:,}"),
        ("rollbacks", str(summary.rollbacks)),
        ("time", f"{summary.seconds:.1f} s"),
    ]
    rows += [(k.replace("_", " "), loss_text(v)) for k, v in metrics.items()]
    return rows


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
