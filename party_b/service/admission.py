"""What party B agrees to train: a run's config checked against its labels and its limits.

Everything here is decided before anything is built or stored: the model fits the label
set, every size is under the operator's limits, and the top model (its kwargs completed from
party B's labels) is sized on the meta device, so a config that could exhaust memory is
refused with a clear problem instead of being tried.
"""

from typing import Any

import numpy as np
import torch

from api_schemas import RunCreate
from party_b.errors import ProblemError
from party_b.labels import LabelSource
from party_b.service.declared import limit_problem
from party_b.settings import Limits
from party_b.top import TopTrainer
from shared.codec import DownlinkSpec
from shared.models import MODEL_NAMES, build_top, output_kwarg, top_kwargs
from shared.models import task as model_task
from shared.schedule import BatchSchedule, make_schedule

__all__ = ["Admission", "rows_per_step"]


def rows_per_step(spec: RunCreate) -> int:
    """Samples in one step of the run: its batch, times the clients of a 'clients' step."""
    clients = spec.schedule.clients_per_step if spec.schedule.kind == "clients" else 1
    return spec.batch_size * clients


class Admission:
    def __init__(self, labels: LabelSource, limits: Limits) -> None:
        self._labels = labels
        self._limits = limits

    def check(self, spec: RunCreate) -> dict[str, Any]:
        """Refuse a config party B cannot train (422); returns the completed top kwargs."""
        self._check_spec(spec)
        top = self.top_kwargs(spec)
        self._check_given(spec, top)
        try:
            self.new_trainer(spec)  # refuse now what could not be built at alignment
        except ValueError as exc:
            raise ProblemError.invalid(f"top model: {exc}") from None
        return top

    def new_trainer(self, spec: RunCreate) -> TopTrainer:
        """The run's top model and optimizer, freshly initialized from its seed."""
        return TopTrainer(
            model=spec.model,
            top_kwargs=self.top_kwargs(spec),
            cut_dim=spec.width,
            optimizer=spec.optimizer.model_dump(),
            task=self._labels.task,
            seed=spec.seed,
            accuracy_excludes=self._labels.accuracy_excludes,
            prediction_excludes=self._labels.prediction_excludes,
        )

    def top_kwargs(self, spec: RunCreate) -> dict[str, Any]:
        """The run's top kwargs with the ones party B derives from its labels filled in, checked
        (kwargs and size) by a build on the meta device."""
        kwargs: dict[str, Any] = dict(spec.top)
        kwargs[output_kwarg(spec.model)] = self._labels.num_outputs
        if "side_features" in top_kwargs(spec.model):
            kwargs["side_features"] = self._labels.side_width if spec.use_side_features else 0
        self._check_top_sizes(rows_per_step(spec), spec.width, kwargs)
        try:
            # Built on the meta device: validates the kwargs and counts parameters without
            # allocating, so {"hidden": [10**6, 10**6]} is refused instead of exhausting memory.
            with torch.device("meta"):
                model = build_top(spec.model, cut_dim=spec.width, **kwargs)
        except ValueError as exc:
            raise ProblemError.invalid(f"top model: {exc}") from None
        except (RuntimeError, OverflowError, TypeError):  # sizes that overflow 64 bits
            raise limit_problem(
                f"the top model {spec.top} is too large to build",
                "max_top_params",
                self._limits.max_top_params,
            ) from None
        params = sum(p.numel() for p in model.parameters())
        if params > self._limits.max_top_params:
            raise limit_problem(
                f"the top model would have {params:,} parameters",
                "max_top_params",
                self._limits.max_top_params,
            )
        return kwargs

    def batch_schedule(self, spec: RunCreate, train_rows: np.ndarray) -> BatchSchedule:
        """The run's schedule over its train samples (``train_rows``: their label rows)."""
        if spec.schedule.kind == "shuffle":
            return make_schedule(
                n=len(train_rows),
                batch_size=spec.batch_size,
                seed=spec.seed,
                version=spec.schedule_version,
            )
        groups = self._labels.groups
        if groups is None:  # checked at creation; party B restarted without the column
            raise ProblemError.run_state(
                "this run samples by client, and party B's labels have no client column "
                "now: restart it with the label table's client column configured"
            )
        return make_schedule(
            n=len(train_rows),
            batch_size=spec.batch_size,
            seed=spec.seed,
            clients=[groups[r] for r in train_rows.tolist()],
            clients_per_step=spec.schedule.clients_per_step,
            version=spec.schedule_version,
        )

    def _check_given(self, spec: RunCreate, top: dict[str, Any]) -> None:
        """422 for a top kwarg party B derives from its own data (the number of classes, its
        side feature columns) that the caller set to another value: party B would have to
        overwrite it silently, and the caller would train another model than it asked for."""
        derived = {output_kwarg(spec.model): "party B's labels"}
        if "side_features" in top:
            derived["side_features"] = (
                "party B's feature columns (use_side_features)"
                if spec.use_side_features
                else "use_side_features=false"
            )
        for name, source in derived.items():
            given = spec.top.get(name)
            if given is not None and given != top[name]:
                raise ProblemError.invalid(
                    f"top.{name}={given!r}, but {source} make it {top[name]!r}: leave "
                    f"top.{name} out (party B fills it in) or set it to {top[name]!r}"
                )

    def _check_spec(self, spec: RunCreate) -> None:
        if spec.model not in MODEL_NAMES:
            raise ProblemError.invalid(f"unknown model {spec.model!r}; known: {list(MODEL_NAMES)}")
        if model_task(spec.model) != self._labels.task:
            raise ProblemError.invalid(
                f"model {spec.model!r} is for {model_task(spec.model)} tasks but party B's "
                f"labels are for {self._labels.task}"
            )
        if spec.schedule.kind == "clients" and self._labels.groups is None:
            raise ProblemError.invalid(
                "the 'clients' schedule needs the client of every sample, and party B's "
                "labels have no client column"
            )
        lim = self._limits
        checks = [
            ("batch_size", spec.batch_size, "max_batch"),
            ("rows per step", rows_per_step(spec), "max_batch"),
            ("cut_dim", spec.width, "max_dim"),
            ("steps", spec.steps, "max_steps"),
        ]
        several = spec.parties is not None
        for party in spec.feature_parties():  # one, named "a", in a run without parties
            where = f"parties[{party.name}]." if several else ""
            try:
                downlink = DownlinkSpec.from_string(party.downlink)
                downlink.check_width(party.cut_dim)
            except ValueError as exc:
                raise ProblemError.invalid(f"{where}downlink: {exc}") from None
            checks += [
                (f"{where}cut_dim", party.cut_dim, "max_dim"),
                (f"{where}quantizer.q", party.quantizer.q or 1, "max_q"),
                (f"{where}quantizer.L", party.quantizer.L or 1, "max_L"),
                (f"{where}downlink L", downlink.L, "max_L"),  # party B's k-means, each step
            ]
        for name, value, limit in checks:
            if value > getattr(lim, limit):
                raise limit_problem(f"{name}={value}", limit, getattr(lim, limit))

    def _check_top_sizes(self, rows: int, cut_dim: int, kwargs: dict[str, Any]) -> None:
        """Bound every size in the top kwargs before anything is built: a list of a million
        layers takes minutes to build even on the meta device, and a layer that fits the
        parameter limit can still need terabytes of activations for one step of ``rows``
        samples. (Every integer top kwarg of every model is a layer width or an output
        count.)"""
        lim = self._limits
        sizes: list[int] = []
        for name, value in kwargs.items():
            values = value if isinstance(value, list) else [value]
            if isinstance(value, list) and len(value) > lim.max_top_layers:
                raise limit_problem(
                    f"top.{name} has {len(value)} entries", "max_top_layers", lim.max_top_layers
                )
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int):
                    continue  # not a size; the build below judges it
                if v < 0:
                    raise ProblemError.invalid(f"top.{name}={v}: sizes cannot be negative")
                if v > lim.max_dim:
                    raise limit_problem(f"top.{name}={v} (a width)", "max_dim", lim.max_dim)
                sizes.append(v)
        floats = rows * (cut_dim + sum(sizes))
        if floats > lim.max_top_activations:
            raise limit_problem(
                f"the top model's activations for a step of {rows} rows would be {floats:,} floats",
                "max_top_activations",
                lim.max_top_activations,
            )
