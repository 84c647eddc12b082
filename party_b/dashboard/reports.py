"""What the dashboard page reads: the runs of every token with the server's health, and one
run's curves. Plain dataclasses, rendered to JSON by the routes (``party_b.dashboard.routes``).

Everything comes from party B's store (the step log and evaluations its service writes), its
in-memory run cache (which runs hold a model in memory) and its Prometheus registry (memory,
latency), so the page shows what ``/metrics`` and the JSON API show, for all tokens at once.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import Gauge
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import RunCreate, RunStatus
from party_b import store
from party_b.dashboard.compression import RawBaseline
from party_b.dashboard.health import RouteLatency, latency_by_route, memory_bytes
from party_b.errors import ProblemError
from party_b.privacy.accounting import run_privacy_json
from party_b.privacy.policy import default_budget
from party_b.service import Service
from party_b.store import overview
from party_b.store import parties as party_store

__all__ = ["MAX_POINTS", "MAX_RUNS_SHOWN", "Reports", "RunRow", "run_rows"]

MAX_RUNS_SHOWN = 200  # newest first; a party B with more shows the newest
MAX_POINTS = 2000  # points per curve the page may ask for
RECENT_STEPS = 50  # steps per second and bytes per step: over the newest this many steps
STEP_RATE_WINDOW = timedelta(seconds=60)  # the server's steps per second, all runs


@dataclass(frozen=True)
class RunRow:
    """One run as the runs table shows it; ``step``: its last logged step, ``steps``: the
    steps it will take, ``checkpoint``: its newest checkpoint's step, ``aligned``, ``train``,
    ``eval``: samples in the intersection and each split (None before alignment)."""

    id: str
    name: str
    owner: str
    status: str
    model: str
    mode: str
    step: int
    steps: int
    last_activity: datetime
    checkpoint: int | None
    aligned: int | None
    train: int | None
    eval: int | None
    in_memory: bool


@dataclass(frozen=True)
class ServerHealth:
    """Party B's process: open runs (not finished), memory, steps per second over the last
    minute (every run), request latency per route since start-up."""

    started_at: datetime
    uptime_seconds: float
    open_runs: int
    runs_by_status: dict[str, int]
    runs_in_memory: int
    memory_bytes: int
    memory_kind: str
    steps_per_second: float
    latency: list[RouteLatency]


@dataclass(frozen=True)
class Overview:
    server: ServerHealth
    runs: list[RunRow]
    runs_shown_at_most: int = MAX_RUNS_SHOWN


@dataclass(frozen=True)
class Point:
    """Steps ``first``..``last`` of a curve (averages; bytes per step), and the uplink's
    compression over them (None where it is not known: see ``compression``)."""

    first: int
    last: int
    loss: float | None
    accuracy: float | None
    up_bytes: float
    down_bytes: float
    step_ms: float
    compression: float | None


@dataclass(frozen=True)
class Traffic:
    """Bytes per step over the newest ``RECENT_STEPS`` steps, totals over the whole log, and
    the run's compression: raw float32 step bytes over bytes received, for all its steps."""

    up_per_step: float | None
    down_per_step: float | None
    up_total: int
    down_total: int
    raw_per_step: int | None
    compression: float | None


@dataclass(frozen=True)
class PartyTraffic:
    """One feature party of a run with several (docs/PROTOCOL.md 12): its width, quantizer
    and downlink, and its bytes over the run's applied steps (its requests in, its answers
    out), in total and per step."""

    name: str
    cut_dim: int
    quantizer: str  # "pq q=4 L=16" or "raw"
    downlink: str
    steps: int
    up_total: int
    down_total: int
    up_per_step: float | None
    down_per_step: float | None


@dataclass(frozen=True)
class RunReport:
    run: RunRow
    config: dict[str, Any]
    steps_per_second: float | None  # over the newest RECENT_STEPS logged steps
    step_ms: float | None  # party B's mean time per step over them
    traffic: Traffic
    width: int  # steps per point of the curves
    points: list[Point]
    # each as party A got it (``loss``, ``metrics``) and on the true labels (``true_loss``,
    # ``true_metrics``: party B's only; under label DP party A's are on randomized labels)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    # the run's label-privacy policy and epsilon, and its token's spend and budget
    privacy: dict[str, Any] = field(default_factory=dict)
    parties: list[PartyTraffic] = field(default_factory=list)  # a run with several


class Reports:
    """Builds the page's data from party B's parts; every method opens its own session."""

    def __init__(self, service: Service, *, started_at: datetime) -> None:
        self._service = service
        self._sessions: sessionmaker[Session] = service.context.sessions
        self._started_at = started_at
        self._baseline = RawBaseline(service.context.labels)

    def overview(self) -> Overview:
        now = datetime.now(UTC)
        with self._sessions() as session:
            pairs = overview.runs_with_owners(session, limit=MAX_RUNS_SHOWN)
            rows = self._rows(session, pairs)
            by_status = overview.runs_by_status(session)
            recent = overview.steps_since(session, now - STEP_RATE_WINDOW)
        memory, kind = memory_bytes(self._service.context.metrics)
        uptime = (now - self._started_at).total_seconds()
        window = STEP_RATE_WINDOW.total_seconds()
        server = ServerHealth(
            started_at=self._started_at,
            uptime_seconds=uptime,
            open_runs=sum(n for s, n in by_status.items() if s != RunStatus.FINISHED.value),
            runs_by_status=by_status,
            runs_in_memory=_gauge_value(self._service.context.metrics.live_runs),
            memory_bytes=memory,
            memory_kind=kind,
            # over the last minute, or since start-up if that is shorter
            steps_per_second=recent / max(1.0, min(window, uptime)),
            latency=latency_by_route(self._service.context.metrics),
        )
        return Overview(server=server, runs=rows)

    def run(self, run_id: str, points: int) -> RunReport:
        """One run, with curves of at most ``points`` points; 404 problem for no such run."""
        with self._sessions() as session:
            found = overview.runs_with_owners(session, limit=1, run_id=run_id)
            if not found:
                raise ProblemError.not_found(f"no run {run_id!r}")
            row = self._rows(session, found)[0]
            config = RunCreate.from_stored(found[0][0].config)
            width = max(1, math.ceil(row.step / points))
            buckets = overview.step_buckets(session, run_id, width)
            recent = overview.recent_steps(session, run_id, RECENT_STEPS)
            truths = store.operator_evaluations(session, run_id)
            evaluations = [
                {"step": e.step, "split": e.split, "n": e.n, "loss": e.loss}
                | {"metrics": e.metrics, "created_at": overview.as_utc(e.created_at)}
                | _true_labels(truths.get(e.id))
                for e in store.eval_results(session, run_id)
            ]
            privacy = run_privacy_json(
                session,
                run_id,
                found[0][0].owner_id,
                default_budget=default_budget(
                    self._service.context.limits.epsilon_budget, self._service.context.privacy
                ),
            )
            parties = _parties(config, party_store.party_traffic(session, run_id))
        raw = self._baseline.per_step(config)
        rate, step_ms = _recent_rate(recent)
        return RunReport(
            run=row,
            config=config.model_dump(mode="json"),
            steps_per_second=rate,
            step_ms=step_ms,
            traffic=_traffic(buckets, recent, raw),
            width=width,
            points=[_point(b, raw) for b in buckets],
            evaluations=evaluations,
            privacy=privacy,
            parties=parties,
        )

    def _rows(self, session: Session, pairs: list[tuple[store.Run, str]]) -> list[RunRow]:
        return run_rows(session, pairs, self._service)


def _true_labels(truth: store.OperatorEvaluation | None) -> dict[str, Any]:
    """The evaluation on the true labels (party B's own view: under label DP party A's is on
    the randomized ones); None for an evaluation from before they were kept."""
    if truth is None:
        return {"true_loss": None, "true_metrics": None}
    return {"true_loss": truth.loss, "true_metrics": truth.metrics}


def _gauge_value(gauge: Gauge) -> int:
    """The value of a gauge without labels (read the public way: through collect)."""
    return int(next(iter(gauge.collect())).samples[0].value)


def run_rows(
    session: Session, pairs: list[tuple[store.Run, str]], service: Service
) -> list[RunRow]:
    """The table rows of ``pairs`` (run, owner name): two queries, one index lookup per run
    (never a scan of the step log)."""
    ids = [run.id for run, _ in pairs]
    logged = overview.last_logged(session, ids)
    checkpoints = overview.newest_checkpoints(session, ids)
    return [
        _row(
            run,
            owner,
            logged.get(run.id),
            checkpoints.get(run.id),
            in_memory=service.context.cache.peek(run.id) is not None,
        )
        for run, owner in pairs
    ]


def _row(
    run: store.Run,
    owner: str,
    logged: tuple[int, datetime] | None,
    checkpoint: int | None,
    *,
    in_memory: bool,
) -> RunRow:
    config = run.config
    activity = [overview.as_utc(run.updated_at), overview.as_utc(run.created_at)]
    if logged is not None:
        activity.append(logged[1])
    aligned = len(run.aligned_ids) // 32 if run.aligned_ids is not None else None
    return RunRow(
        id=run.id,
        name=run.name,
        owner=owner,
        status=run.status,
        model=str(config.get("model", "")),
        mode=str(config.get("quantizer", {}).get("mode", ""))
        or f"{len(config.get('parties') or [])} parties",
        step=logged[0] if logged is not None else 0,
        steps=int(config.get("steps", 0)),
        last_activity=max(activity),
        checkpoint=checkpoint,
        aligned=aligned,
        train=run.train_size if aligned is not None else None,
        eval=run.eval_size if aligned is not None else None,
        in_memory=in_memory,
    )


def _parties(config: RunCreate, traffic: dict[str, tuple[int, int, int]]) -> list[PartyTraffic]:
    """The feature parties of a run with several, in fusion order, with their traffic."""
    out = []
    for party in config.parties or []:
        q = party.quantizer
        steps, up, down = traffic.get(party.name, (0, 0, 0))
        out.append(
            PartyTraffic(
                name=party.name,
                cut_dim=party.cut_dim,
                quantizer=f"pq q={q.q} L={q.L}" + (f" R={q.R}" if q.R > 1 else "")
                if q.mode == "pq"
                else "raw",
                downlink=party.downlink,
                steps=steps,
                up_total=up,
                down_total=down,
                up_per_step=up / steps if steps else None,
                down_per_step=down / steps if steps else None,
            )
        )
    return out


def _recent_rate(recent: Sequence[store.StepLog]) -> tuple[float | None, float | None]:
    """(steps per second, mean ms per step at party B) over the newest logged steps."""
    if not recent:
        return None, None
    step_ms = sum(r.total_ms for r in recent) / len(recent)
    if len(recent) < 2:
        return None, step_ms
    newest, oldest = recent[0], recent[-1]
    span = overview.as_utc(newest.created_at) - overview.as_utc(oldest.created_at)
    seconds = span.total_seconds()
    rate = (newest.step - oldest.step) / seconds if seconds > 0 else None
    return rate, step_ms


def _traffic(
    buckets: list[overview.Bucket], recent: Sequence[store.StepLog], raw: int | None
) -> Traffic:
    up_total = sum(b.bytes_in for b in buckets)
    steps = sum(b.steps for b in buckets)
    return Traffic(
        up_per_step=sum(r.bytes_in for r in recent) / len(recent) if recent else None,
        down_per_step=sum(r.bytes_out for r in recent) / len(recent) if recent else None,
        up_total=up_total,
        down_total=sum(b.bytes_out for b in buckets),
        raw_per_step=raw,
        compression=raw * steps / up_total if raw is not None and up_total else None,
    )


def _point(bucket: overview.Bucket, raw: int | None) -> Point:
    return Point(
        first=bucket.first,
        last=bucket.last,
        loss=bucket.loss,
        accuracy=bucket.accuracy,
        up_bytes=bucket.bytes_in / bucket.steps,
        down_bytes=bucket.bytes_out / bucket.steps,
        step_ms=bucket.step_ms,
        compression=raw * bucket.steps / bucket.bytes_in if raw and bucket.bytes_in else None,
    )
