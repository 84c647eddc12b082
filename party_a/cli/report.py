"""What ``fedlite-a train`` shows: a progress bar (or log lines) and the closing summary.

Nothing here is shown before it is known: the bar's loss and ratio read "-" until the first
step of this session has come back, instead of a made-up ``loss 0.0000``; a loss party B's
label-privacy policy withholds (NaN on the wire, docs/PROTOCOL.md 4.2.2) reads "withheld by
party B", never ``nan``, which reads as a diverged run.

Under party B's label DP (``RunOut.privacy``) the user is told so when the run starts
(``privacy_lines``) and in the summary, which shows each held-out metric as party B sent it,
on the run's randomized labels, and beside it an estimate of the true-label metric with its
95 % interval (``party_a.debiased``): an AUC of 0.53 on randomized labels is not a broken
model.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from party_a.debiased import Estimate, true_accuracy, true_auc

if TYPE_CHECKING:
    from api_schemas import RunOut, RunPrivacyOut

__all__ = [
    "WITHHELD",
    "human_bytes",
    "loss_text",
    "privacy_lines",
    "privacy_text",
    "progress",
    "summary_rows",
    "true_label_estimates",
]

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


def privacy_text(privacy: "RunPrivacyOut | None") -> str:
    """The run's label privacy in a few words, as the summary's row shows it."""
    if privacy is None:
        return "not reported by party B"
    if not privacy.label_dp:
        return f"no label DP ({privacy.policy}): metrics on the true labels"
    return (
        f"label DP on, epsilon {privacy.epsilon:g} per party B label table: party B trains "
        "and evaluates on randomized labels"
    )


def privacy_lines(privacy: "RunPrivacyOut | None") -> list[str]:
    """What ``fedlite-a train`` says when the run starts, where party B protects its labels
    (nothing otherwise)."""
    if privacy is None or not privacy.label_dp or privacy.epsilon is None:
        return []
    bound = math.exp(privacy.epsilon) / (1.0 + math.exp(privacy.epsilon))
    lines = [
        f"label privacy: party B gives this run label differential privacy, epsilon "
        f"{privacy.epsilon:g} (any test of one label from what this run sends reaches an AUC "
        f"of at most {bound:.3f}).",
        "  Party B trains on randomized labels, one draw per label table; the loss is "
        + ("withheld, and " if privacy.metrics == "none" else "")
        + "evaluations are on the randomized labels, so they read lower than the model is: "
        "the summary also estimates the true-label metrics.",
    ]
    return lines


def summary_rows(
    summary: Any,
    metrics: dict[str, float],
    http: tuple[int, int],
    *,
    run: "RunOut | None" = None,
    evaluated: int = 0,
) -> list[tuple[str, str]]:
    """The closing table: every byte that crossed, both ways, and the held-out metrics.

    ``http``: message bodies this process sent and received over HTTP, every call counted
    (PSI, alignment, steps, evaluation, finish; retries included). ``run``: party B's view
    of the run, whose privacy says how to read the metrics of ``evaluated`` held-out rows.
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
    privacy = run.privacy if run is not None else None
    if privacy is None or not privacy.label_dp:
        rows += [(k.replace("_", " "), loss_text(v)) for k, v in metrics.items()]
        return rows
    rows.append(("label privacy", privacy_text(privacy)))
    estimates = true_label_estimates(
        {k.removeprefix("eval_"): v for k, v in metrics.items()}, run, evaluated
    )
    for key, value in metrics.items():
        if key == "eval_label_rate":  # what the estimates read; not a metric of the model
            continue
        rows.append((f"{key.replace('_', ' ')} (randomized labels)", loss_text(value)))
        estimate = estimates.get(key.removeprefix("eval_"))
        if estimate is not None:
            rows.append((f"{key.replace('_', ' ')}, true labels (estimate)", _interval(estimate)))
    return rows


def true_label_estimates(
    metrics: dict[str, float], run: "RunOut | None", n: int
) -> dict[str, Estimate]:
    """Estimates of the true-label ``accuracy`` and ``auc`` of ``n`` held-out rows whose
    ``metrics`` (as party B names them, ``label_rate`` included) are on the run's randomized
    labels; empty where the run has no label DP or nothing can be estimated. Only for rows
    the model was not trained on (``party_a.debiased``): the held-out split."""
    privacy = run.privacy if run is not None else None
    if run is None or privacy is None or not privacy.label_dp or privacy.label_keep is None:
        return {}
    keep, estimates = privacy.label_keep, {}
    if n and "accuracy" in metrics:
        estimates["accuracy"] = true_accuracy(
            metrics["accuracy"], keep=keep, classes=run.num_classes, n=n
        )
    if n and "auc" in metrics and "label_rate" in metrics:
        rate = metrics["label_rate"]
        estimates["auc"] = true_auc(metrics["auc"], keep=keep, label_rate=rate, n=n)
    return {k: v for k, v in estimates.items() if v is not None}


def _interval(estimate: Estimate) -> str:
    return f"{estimate.value:.4f} (95 % interval {estimate.low:.3f} to {estimate.high:.3f})"


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
