"""Party A's training session: find or create the run, align ids, train, evaluate, finish.

Crash recovery needs no operator. Party A keeps checkpoints at the same steps as party B
(every ``checkpoint_interval``). Whenever the two disagree about where the run is -- party B
restarted from an older checkpoint, or party A itself restarted -- party A reads party B's
applied step and checkpoint list and:

* if party B has applied exactly party A's step: carries on;
* if party B is one step ahead (it applied a step whose answer was lost): resends that step,
  which party B answers from its stored response;
* otherwise: restores the newest checkpoint both sides hold and asks party B to ``resume``
  from it, then replays. Every step is derived from (seed, step), so the replay is
  bit-identical and the run ends exactly as an uninterrupted one would.
"""

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api_schemas import AlignmentIn, RunOut
from party_a import serving as run_serving
from party_a.alignment import private_intersection
from party_a.bottom import BottomTrainer, PendingStep, StepResult
from party_a.client import Transport
from party_a.config import PartyAConfig
from party_a.errors import ConfigError, NotFound, ProtocolError, RunNotFound
from party_a.features import FeatureTable, FeatureTransform
from party_a.pipeline import run_steps
from party_a.state import LocalRun, LocalStep, LocalStore, PsiResult
from shared import codec
from shared.accounting import raw_step_request_bytes
from shared.alignment import hmac_ids, order_by_raw_id
from shared.devices import resolve_device
from shared.models import cut_dim as model_cut_dim
from shared.models import input_width_kwarg
from shared.schedule import (
    SCHEDULE_VERSION,
    BatchSchedule,
    StepBatch,
    make_schedule,
    split_train_eval,
)

__all__ = ["PartyATrainer", "TrainSummary"]

log = logging.getLogger("fedlite.party_a")

CHECKPOINTS_KEPT = 3


@dataclass
class TrainSummary:
    run_id: str
    steps: int  # steps of the run
    last_step: int  # last step applied
    last_loss: float
    bytes_sent: int  # step request bodies sent (training only, all attempts that counted)
    bytes_received: int
    raw_bytes: int  # what SplitFed's raw float32 requests would have been
    seconds: float
    alignment_bytes: int = 0  # the id exchange before training, both directions
    rollbacks: int = 0
    resent: int = 0  # pipelined requests that overtook their predecessor, sent again
    eval_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def compression(self) -> float:
        return self.raw_bytes / self.bytes_sent if self.bytes_sent else 1.0


@functools.lru_cache(maxsize=64)
def _raw_request_bytes(d: int, chunk_sizes: tuple[int, ...]) -> int:
    """Measured by encoding (so headers count); cached, but bounded: under the clients
    schedule the chunk sizes can differ at every step."""
    return raw_step_request_bytes(d=d, batch=chunk_sizes)


class PartyATrainer:
    def __init__(
        self,
        *,
        config: PartyAConfig,
        features: FeatureTable,
        transport: Transport,
        store: LocalStore,
        server: str,
        on_step: Callable[[StepResult, TrainSummary], None] | None = None,
    ) -> None:
        self.config = config
        self.features = features
        self.transport = transport
        self.store = store
        self.server = server
        self.on_step = on_step
        bottom_kwargs = dict(config.model.bottom)
        width_kwarg = input_width_kwarg(config.run.model)
        if width_kwarg is not None:
            bottom_kwargs.setdefault(width_kwarg, features.x.shape[1])
        self.bottom_kwargs = bottom_kwargs
        self.cut_dim = model_cut_dim(config.run.model, **bottom_kwargs)
        self.bottom = BottomTrainer(
            model=config.run.model,
            bottom_kwargs=bottom_kwargs,
            quantizer={
                **config.quantizer.model_dump(by_alias=True),
            },
            optimizer=config.optimizer.bottom.model_dump(),
            seed=config.run.seed,
            device=resolve_device(config.run.device),  # DeviceUnavailable: a ValueError
        )
        self.local: LocalRun | None = None
        self.step = 0
        self.rows: np.ndarray = np.zeros(0, dtype=np.int64)  # feature row of each aligned key
        self.x: np.ndarray = features.x  # the table through the run's transform (prepare)
        self.transform: FeatureTransform | None = None
        self.aligned: list[bytes] = []
        self.train_pos: np.ndarray = np.zeros(0, dtype=np.int64)
        self.eval_pos: np.ndarray = np.zeros(0, dtype=np.int64)
        self.batches: BatchSchedule | None = None  # set by prepare()
        self.schedule_version = SCHEDULE_VERSION  # the run's, as party B recorded it

    # ================================================================== set-up

    @property
    def run_id(self) -> str:
        assert self.local is not None, "call prepare() first"
        return self.local.remote_id

    def prepare(self, *, create: bool = True, serving: bool = False) -> RunOut:
        """Find the local run (or create it at party B), align ids, restore the checkpoint.

        ``create=False`` (evaluate, predict, finish): a run this state has no record of is
        :class:`RunNotFound`, never a new, untrained run at party B. ``serving`` (predict):
        the feature table is a serving table, which need not hold the training rows.
        """
        spec = self.config.run_create(self.cut_dim)
        local = self.store.find_run(self.server, self.config.run.name)
        if local is None and not create:
            raise RunNotFound(self.config.run.name, self.server)
        if local is not None and local.config != self._fingerprint():
            raise ConfigError(
                f"a run named {self.config.run.name!r} with another configuration exists in "
                "this state directory; choose a new [run] name"
            )
        if local is not None:
            try:
                remote = self.transport.get_run(local.remote_id)
            except NotFound:
                raise ConfigError(
                    f"party B no longer knows run {local.remote_id} ({local.name}); "
                    "choose a new [run] name or another state directory"
                ) from None
        else:
            remote = self.transport.create_run(spec, self._create_key())
            local = self.store.add_run(
                LocalRun(
                    server=self.server,
                    name=self.config.run.name,
                    remote_id=remote.id,
                    config=self._fingerprint(),
                    alignment_key=remote.alignment_key,
                )
            )
            log.info("created run %s at party B", remote.id)
        self.local = local
        self.schedule_version = remote.config.schedule_version  # party B's record decides
        self._align(local, serving=serving)
        checkpoint = self.store.load_checkpoint(local.id)
        if checkpoint is None:
            model_state, optimizer_state = self.bottom.state()
            self.store.save_checkpoint(
                local.id, 0, model_state, optimizer_state, keep=CHECKPOINTS_KEPT
            )
        else:
            self.bottom.load_state(checkpoint.model_state, checkpoint.optimizer_state)
            self.step = checkpoint.step
            self.store.forget_after(local.id, checkpoint.step)
            log.info("resuming run %s from local checkpoint at step %d", local.remote_id, self.step)
        return self.transport.get_run(local.remote_id)

    def _fingerprint(self) -> dict[str, Any]:
        """The config a local run is found again by. Settings added since at their old
        behaviour (``pipeline_depth`` = 1, no ``downlink``, torch's AdaGrad start, packed
        codewords) are left out, so that state directories written before them keep matching
        their runs."""
        run, optimizers = self.config.run, self.config.optimizer
        unset = {"device"}  # a local execution choice, never part of the run
        unset |= {"pipeline_depth"} if run.pipeline_depth == 1 else set()
        unset |= {"downlink"} if run.downlink is None else set()
        exclude: dict[str, Any] = {"run": unset}
        if self.config.quantizer.codewords == "packed":
            exclude["quantizer"] = {"codewords"}
        for side in ("bottom", "top"):  # AdaGrad's accumulator start and eps: torch's defaults
            spec = getattr(optimizers, side)
            added = {"initial_accumulator"} if spec.initial_accumulator == 0.0 else set()
            added |= {"eps"} if spec.eps is None else set()
            exclude.setdefault("optimizer", {})[side] = added
        return self.config.model_dump(mode="json", by_alias=True, exclude=exclude)

    def _create_key(self) -> str:
        """Idempotency-Key of this run's creation: the same for this state directory, server,
        run name and config, so that a party A killed between party B's answer and writing
        the run down gets the same run back when it is run again, not a second run."""
        material = json.dumps(
            [self.store.identity(), self.server, self.config.run.name, self._fingerprint()],
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()

    def psi(self, *, force: bool = False) -> tuple[PsiResult, bool]:
        """The private set intersection with party B (cached per pair of dataset versions)."""
        return private_intersection(
            self.features.ids,
            transport=self.transport,
            store=self.store,
            server=self.server,
            force=force,
        )

    def _align(self, local: LocalRun, *, serving: bool = False) -> None:
        """Align the run on the PSI intersection; party B sees HMACs of those ids only."""
        key = bytes.fromhex(local.alignment_key)
        keys = hmac_ids(key, self.features.ids)
        if local.aligned_ids is None:
            psi, cached = self.psi()
            offered = hmac_ids(key, psi.intersection)
            if not offered:
                raise ConfigError("party A and party B hold no sample id in common")
            request = AlignmentIn(hashed_ids=[k.hex() for k in offered])
            answer = self.transport.align(local.remote_id, request.hashed_ids)
            # what travels is counted: the JSON bodies as HttpTransport sends and receives them,
            # plus the PSI messages when this run's alignment is the one that ran the PSI
            traffic = len(request.model_dump_json()) + len(answer.model_dump_json())
            traffic += 0 if cached else psi.wire_bytes
            self.store.update_run(local.id, alignment_bytes=traffic)
            local.alignment_bytes = traffic
            common = {bytes.fromhex(h) for h in answer.intersection}
            if not common <= set(offered):
                raise ProtocolError("party B aligned the run on ids party A did not offer")
            aligned = order_by_raw_id(self.features.ids, keys, common)
            self.store.update_run(local.id, aligned_ids=b"".join(aligned))
            local.aligned_ids = b"".join(aligned)
            log.info(
                "aligned %d samples (%d train, %d eval)", len(aligned), answer.train, answer.eval
            )
        blob = local.aligned_ids
        self.aligned = [blob[i : i + 32] for i in range(0, len(blob), 32)]
        row_of = {k: row for row, k in enumerate(keys)}
        missing = [k for k in self.aligned if k not in row_of]
        self.train_pos, self.eval_pos = split_train_eval(
            len(self.aligned),
            seed=self.config.run.seed,
            eval_fraction=self.config.run.eval_fraction,
            version=self.schedule_version,
        )
        if missing and not serving:
            raise ConfigError(f"{len(missing)} aligned ids are not in the feature table any more")
        if not missing:
            self.rows = np.array([row_of[k] for k in self.aligned], dtype=np.int64)
        train_rows = self.rows[self.train_pos] if not missing else None
        self.transform = run_serving.run_transform(self.store, local.id, self.features, train_rows)
        self.x = self.transform.apply(self.features)
        if not missing:
            self.batches = self._batch_schedule()

    def _batch_schedule(self) -> BatchSchedule:
        run = self.config.run
        if run.schedule.kind == "shuffle":
            return make_schedule(
                n=len(self.train_pos),
                batch_size=run.batch_size,
                seed=run.seed,
                version=self.schedule_version,
            )
        groups = self.features.groups
        if groups is None:
            raise ConfigError(
                "the 'clients' schedule needs the client of every row: set [data] group_column"
            )
        return make_schedule(
            n=len(self.train_pos),
            batch_size=run.batch_size,
            seed=run.seed,
            clients=[groups[r] for r in self.rows[self.train_pos].tolist()],
            clients_per_step=run.schedule.clients_per_step,
            version=self.schedule_version,
        )

    def batch(self, step: int) -> StepBatch:
        """Step ``step``'s rows as positions into the aligned list, and its chunk sizes."""
        assert self.batches is not None, "call prepare() first"
        batch = self.batches.batch(step)
        return StepBatch(self.train_pos[batch.positions], batch.chunk_sizes)

    # ================================================================== training

    def train(self) -> TrainSummary:
        """Run every remaining step; resumable at any point by calling it again."""
        assert self.local is not None, "call prepare() first"
        run = self.config.run
        summary = TrainSummary(
            run_id=self.run_id,
            steps=run.steps,
            last_step=self.step,
            last_loss=float("nan"),
            bytes_sent=0,
            bytes_received=0,
            raw_bytes=0,
            seconds=0.0,
            alignment_bytes=self.local.alignment_bytes,
        )
        started = time.perf_counter()
        self._reconcile(summary)
        run_steps(self, summary)
        summary.seconds = time.perf_counter() - started
        self.freeze_codebook()
        return summary

    def _after_step(
        self, pending: PendingStep, result: StepResult, summary: TrainSummary, seconds: float
    ) -> None:
        assert self.local is not None
        self.step = pending.step
        summary.last_step = pending.step
        summary.last_loss = result.loss
        summary.bytes_sent += len(pending.body)
        summary.bytes_received += result.bytes_received
        raw_bytes = self._raw_bytes(pending.chunk_sizes)
        summary.raw_bytes += raw_bytes
        self.store.log_step(
            LocalStep(
                run_id=self.local.id,
                step=pending.step,
                loss=result.loss if np.isfinite(result.loss) else None,
                bytes_sent=len(pending.body),
                bytes_received=result.bytes_received,
                raw_bytes=raw_bytes,
                step_ms=1000 * seconds,
            )
        )
        run = self.config.run
        if pending.step % run.checkpoint_interval == 0 or pending.step == run.steps:
            model_state, optimizer_state = self.bottom.state()
            self.store.save_checkpoint(
                self.local.id, pending.step, model_state, optimizer_state, keep=CHECKPOINTS_KEPT
            )
        if self.on_step is not None:
            self.on_step(result, summary)

    def _raw_bytes(self, chunk_sizes: tuple[int, ...]) -> int:
        """Bytes of the SplitFed request (raw float32 chunks) with these chunk sizes."""
        return _raw_request_bytes(self.cut_dim, chunk_sizes)

    def _reconcile(self, summary: TrainSummary) -> None:
        """Bring party A and party B to the same step (see the module docstring)."""
        assert self.local is not None
        remote = self.transport.get_run(self.run_id)
        if remote.step in (self.step, self.step + 1):
            return  # in step, or party B will replay its stored answer for step + 1
        local_steps = self.store.checkpoint_steps(self.local.id)
        common = [
            s for s in local_steps if s in remote.checkpoints and s <= min(self.step, remote.step)
        ]
        if not common:
            raise ProtocolError(
                f"no common checkpoint: party A has {local_steps} (at step {self.step}), "
                f"party B has {remote.checkpoints} (at step {remote.step})"
            )
        target = max(common)
        checkpoint = self.store.load_checkpoint(self.local.id, target)
        assert checkpoint is not None
        self.bottom.load_state(checkpoint.model_state, checkpoint.optimizer_state)
        self.store.forget_after(self.local.id, target)
        if remote.step != target:
            self.transport.resume(self.run_id, target)
        log.warning(
            "rolled back to step %d (party A was at %d, party B at %d)",
            target,
            self.step,
            remote.step,
        )
        self.step = target
        summary.last_step = target
        summary.rollbacks += 1

    # ================================================================== serving

    def evaluate(self, split: str = "eval", *, raw: bool = False) -> codec.EvaluateResponse:
        """Metrics of the held-out (or train) samples, computed at party B (party_a.serving)."""
        return run_serving.evaluate(self, split, raw=raw)

    def predict(self, ids: list[str], *, raw: bool = False) -> codec.PredictResponse:
        """Party B's scores for ``ids``, each independent of the others (party_a.serving)."""
        return run_serving.predict(self, ids, raw=raw)

    def freeze_codebook(self) -> None:
        """The serving codebook of the model at its current step (party_a.serving)."""
        assert self.local is not None
        train_x = self.x[self.rows[self.train_pos]] if len(self.rows) else None
        run_serving.freeze_codebook(self.store, self.local, self.bottom, self.step, train_x)

    def close(self) -> None:
        """Close the transport (if it has connections) and the local database."""
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()
        self.store.close()

    def finish(self) -> RunOut:
        assert self.local is not None
        remote = self.transport.finish(self.run_id)
        self.store.update_run(self.local.id, status="finished")
        return remote
