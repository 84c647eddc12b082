"""Per-run progress, traffic and (opted in) loss on ``/metrics``, read from the store at
scrape time.

What the dashboard shows of each run, as Prometheus gauges, so that a Grafana board
(docker/grafana-dashboard.json) can show the same. Every series carries ``run_id``, ``name``
and ``owner`` (the token name); runs in training or created are exported, and finished runs
for a day after they finished, at most ``MAX_RUNS_SHOWN`` of them: the series of a run stop
when it leaves that set. A scrape costs a handful of grouped queries whatever the number of
runs. This collector sits on a registry of its own, which ``/metrics`` adds only for the
operator's credential (``party_b.api.routes.ops``). The series computed from labels (last
step's loss and accuracy, evaluations) are exported only with ``label_series``
(``FEDLITE_B_METRICS_LABEL_SERIES``): they are what the run's privacy policy withholds from
party A, and a monitoring system is one more place to keep them from.
"""

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from api_schemas import RunCreate, RunStatus
from party_b.dashboard.compression import RawBaseline
from party_b.dashboard.reports import MAX_RUNS_SHOWN, RunRow, run_rows
from party_b.service import Service
from party_b.store import overview

__all__ = ["FINISHED_SHOWN", "RunCollector"]

log = logging.getLogger("fedlite.party_b")

FINISHED_SHOWN = timedelta(days=1)  # a finished run's series stay this long after it finished
RUN = ["run_id", "name", "owner"]


class RunCollector(Collector):
    """A prometheus_client collector over a party B's runs (registered on its own registry)."""

    def __init__(self, service: Service, *, label_series: bool = False) -> None:
        self._service = service
        self._baseline = RawBaseline(service.context.labels)
        self._label_series = label_series

    def collect(self) -> Iterator[Metric]:
        try:
            families = self._families()
        except SQLAlchemyError as exc:  # the scrape still gets the process's other metrics
            log.warning("per-run metrics left out of this scrape: %s", exc)
            return
        yield from families

    def _families(self) -> list[Metric]:
        since = datetime.now(UTC) - FINISHED_SHOWN
        with self._service.context.sessions() as session:
            pairs = overview.runs_with_owners(
                session, limit=MAX_RUNS_SHOWN, finished=(RunStatus.FINISHED.value, since)
            )
            rows = run_rows(session, pairs, self._service)
            ids = [row.id for row in rows]
            totals = overview.step_totals(session, ids)
            last = overview.last_steps(session, ids)
            evaluations = overview.latest_evaluations(session, ids)
            by_status = overview.runs_by_status(session)
        configs = {run.id: RunCreate.from_stored(run.config) for run, _ in pairs}
        gauges = _Gauges()
        for row in rows:
            labels = [row.id, row.name, row.owner]
            gauges.run(row, labels)
            step = last.get(row.id)
            if step is not None and self._label_series:
                gauges.last_step(labels, step.loss, step.accuracy)
            sums = totals.get(row.id)
            if sums is not None:
                raw = self._baseline.per_step(configs[row.id])
                gauges.traffic(labels, sums, raw)
            for result in evaluations.get(row.id, []) if self._label_series else []:
                gauges.evaluation(labels, result.split, result.loss, result.metrics)
        for status in RunStatus:
            gauges.runs.add_metric([status.value], by_status.get(status.value, 0))
        return gauges.all()


class _Gauges:
    """The per-run metric families of one scrape, filled run by run."""

    def __init__(self) -> None:
        def gauge(name: str, documentation: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=[*RUN, *extra])

        self.runs = GaugeMetricFamily("fedlite_b_runs", "runs by status", labels=["status"])
        self.info = gauge("fedlite_b_run_info", "1 per run shown", ("status", "model", "mode"))
        self.step = gauge("fedlite_b_run_step", "last training step applied and logged")
        self.steps = gauge("fedlite_b_run_steps", "training steps the run will take")
        self.checkpoint = gauge("fedlite_b_run_checkpoint_step", "newest checkpoint's step")
        self.aligned = gauge("fedlite_b_run_aligned_samples", "samples in the intersection")
        self.activity = gauge(
            "fedlite_b_run_last_activity_timestamp_seconds", "last step or change (Unix time)"
        )
        self.loss = gauge("fedlite_b_run_loss", "training loss of the last step's batch")
        self.accuracy = gauge("fedlite_b_run_accuracy", "accuracy of the last step's batch")
        self.up = gauge(
            "fedlite_b_run_received_bytes", "step request bytes received (the run's step log)"
        )
        self.down = gauge("fedlite_b_run_sent_bytes", "step response bytes sent (step log)")
        self.compression = gauge(
            "fedlite_b_run_compression_ratio",
            "raw float32 step request bytes over bytes received (shuffle schedule only)",
        )
        self.eval_loss = gauge("fedlite_b_run_eval_loss", "newest evaluation's loss", ("split",))
        self.eval_metric = gauge(
            "fedlite_b_run_eval_metric", "newest evaluation's metrics", ("split", "metric")
        )

    def run(self, row: RunRow, labels: list[str]) -> None:
        self.info.add_metric([*labels, row.status, row.model, row.mode], 1)
        self.step.add_metric(labels, row.step)
        self.steps.add_metric(labels, row.steps)
        self.activity.add_metric(labels, row.last_activity.timestamp())
        if row.checkpoint is not None:
            self.checkpoint.add_metric(labels, row.checkpoint)
        if row.aligned is not None:
            self.aligned.add_metric(labels, row.aligned)

    def last_step(self, labels: list[str], loss: float | None, accuracy: float | None) -> None:
        if loss is not None:
            self.loss.add_metric(labels, loss)
        if accuracy is not None:
            self.accuracy.add_metric(labels, accuracy)

    def traffic(self, labels: list[str], sums: overview.StepTotals, raw: int | None) -> None:
        self.up.add_metric(labels, sums.bytes_in)
        self.down.add_metric(labels, sums.bytes_out)
        if raw is not None and sums.bytes_in:
            self.compression.add_metric(labels, raw * sums.steps / sums.bytes_in)

    def evaluation(
        self, labels: list[str], split: str, loss: float | None, metrics: dict[str, object]
    ) -> None:
        if loss is not None:
            self.eval_loss.add_metric([*labels, split], loss)
        for metric, value in sorted(metrics.items()):
            if isinstance(value, int | float):
                self.eval_metric.add_metric([*labels, split, metric], float(value))

    def all(self) -> list[Metric]:
        return [value for value in vars(self).values() if isinstance(value, GaugeMetricFamily)]
