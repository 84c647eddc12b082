"""Party A's run: find or create it at party B, align ids, train, evaluate, finish.

``PartyATrainer`` holds one run's pieces (config, feature table, bottom model, local store,
transport) and is the ``StepPort`` the step loop drives (``party_a.loop``): it forwards a
step's batch, sends it, applies the answer and commits it. Recovery
(``party_a.recovery``) and inference (``party_a.inference``) are rooms of their own that it
calls with what they need; neither reads the trainer.

Round trips before step 1: one (the run's creation, or one GET of a run this state holds);
the PSI and the alignment when the run is new. ``predict`` needs none beyond its own request
when party A's state holds the run's codebook and intersection.
"""

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from api_schemas import RunOut
from api_schemas.runs import AlignmentInfo
from party_a import inference, recovery
from party_a.alignment import AlignedData, align_run, known_intersection, private_intersection
from party_a.bottom import BottomTrainer, PendingStep, StepResult
from party_a.config import PartyAConfig
from party_a.errors import CheckpointNotFound, ConfigError, NotFound, RunNotFound, StepOutOfOrder
from party_a.features import FeatureTable
from party_a.loop import LoopSettings, StepRecord, TrainSummary, run_steps
from party_a.phases import phase
from party_a.preparation import FeatureTransform, bottom_kwargs
from party_a.store import LocalRun, LocalStep, LocalStore, PsiResult
from party_a.transport import Transport
from shared import codec
from shared.accounting import raw_step_request_bytes
from shared.devices import resolve_device
from shared.models import cut_dim as model_cut_dim
from shared.schedule import (
    SCHEDULE_VERSION,
    BatchSchedule,
    StepBatch,
    batch_digest,
    make_schedule,
    split_train_eval,
)

__all__ = ["PartyATrainer", "TrainSummary"]

log = logging.getLogger("fedlite.party_a")

CHECKPOINTS_KEPT = 3


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
        self.cut_dim = model_cut_dim(config.run.model, **config.model.bottom)
        self.device = resolve_device(config.run.device)  # DeviceUnavailable: a ValueError
        # built once the run's preparation is known (its width and categories): see bottom
        self._bottom: BottomTrainer | None = None
        self.local: LocalRun | None = None
        self.step = 0
        self.data: AlignedData | None = None  # set by prepare()
        self.batches: BatchSchedule | None = None  # None when serving from a serving table
        self.schedule_version = SCHEDULE_VERSION  # the run's, as party B recorded it
        self._remote: RunOut | None = None  # party B as prepare() last saw it
        self._unlogged: list[LocalStep] = []  # step-log rows since the last checkpoint

    # ================================================================== set-up

    @property
    def run_id(self) -> str:
        assert self.local is not None, "call prepare() first"
        return self.local.remote_id

    @property
    def bottom(self) -> BottomTrainer:
        """The bottom model of the run's prepared input: built from the fitted preparation
        (``self.data.transform``, or the one stored with the run) when first asked for."""
        if self._bottom is None:
            self._bottom = BottomTrainer(
                model=self.config.run.model,
                bottom_kwargs=bottom_kwargs(
                    self.config.run.model, dict(self.config.model.bottom), self._transform()
                ),
                quantizer=self.config.quantizer.model_dump(by_alias=True),
                optimizer=self.config.optimizer.bottom.model_dump(),
                seed=self.config.run.seed,
                device=self.device,
            )
        return self._bottom

    def _transform(self) -> FeatureTransform:
        """The run's preparation: fitted (or stored) once the run is aligned; before that,
        for a table of numbers without missing values, the one it will have (the same width,
        no categories), so that the bottom model exists from the start, as it always did."""
        if self.data is not None:
            return self.data.transform
        stored = self.store.serving(self.local.id) if self.local is not None else None
        if stored is not None:
            return FeatureTransform.from_json(stored.transform)
        unfitted = FeatureTransform.of_numbers(self.features)
        if unfitted is None:
            raise ConfigError(
                "a table with categories or missing values has the bottom model of its fitted "
                "preparation, which the run's alignment fits: call prepare() first"
            )
        return unfitted

    @property
    def eval_pos(self) -> np.ndarray:
        """Positions of the held-out samples in the aligned list."""
        assert self.data is not None, "call prepare() first"
        return self.data.eval_pos

    def prepare(self, *, create: bool = True) -> RunOut:
        """Find the local run (or create it at party B), align ids, restore the checkpoint;
        party B's view of the run. ``create=False`` (evaluate, finish): a run this state
        has no record of is :class:`RunNotFound`, never a new, untrained run at party B."""
        local = self._local_run(create=create)
        if local is None:
            phase("creating run %r at party B", self.config.run.name)
            remote = self.transport.create_run(
                self.config.run_create(self.cut_dim), self._create_key()
            )
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
        else:
            remote = self._get_run(local)
            phase("run %r: %s at party B, step %d", local.name, remote.status.value, remote.step)
        self.local = local
        self.schedule_version = remote.config.schedule_version  # party B's record decides
        self.data, answer = align_run(
            local,
            features=self.features,
            transport=self.transport,
            store=self.store,
            server=self.server,
            split=self._split,
        )
        if answer is not None:
            info = AlignmentInfo(
                aligned=len(answer.intersection), train=answer.train, eval=answer.eval
            )
            remote = remote.model_copy(update={"alignment": info})
        self.batches = self._batch_schedule()
        self._restore()
        self._remote = remote
        return remote

    def prepare_serving(self) -> None:
        """Make ready to score (predict) a run this state holds, from party A's state alone:
        no request to party B unless the serving codebook is missing and must be fitted on
        the training rows (which needs party B's record of the run's schedule)."""
        local = self._local_run(create=False)
        assert local is not None
        if local.aligned_ids is None:
            raise ConfigError(f"run {local.name!r} was never aligned: run `fedlite-a train`")
        self.local = local
        steps = self.store.checkpoint_steps(local.id)  # the step _restore() will restore
        needs_split = self.config.quantizer.mode == "pq" and (
            inference.stored_codebook(self.store, local.id, steps[-1] if steps else 0) is None
        )
        if needs_split:
            self.schedule_version = self._get_run(local).config.schedule_version
        self.data, _ = align_run(
            local,
            features=self.features,
            transport=self.transport,
            store=self.store,
            server=self.server,
            split=self._split if needs_split else _no_split,
            serving=True,
        )
        self._restore()  # after the alignment: the bottom model is the preparation's

    def _local_run(self, *, create: bool) -> LocalRun | None:
        local = self.store.find_run(self.server, self.config.run.name)
        if local is None and not create:
            raise RunNotFound(self.config.run.name, self.server)
        if local is not None and local.config != self._fingerprint():
            raise ConfigError(
                f"a run named {self.config.run.name!r} with another configuration exists in "
                "this state directory; choose a new [run] name"
            )
        return local

    def _get_run(self, local: LocalRun) -> RunOut:
        try:
            return self.transport.get_run(local.remote_id)
        except NotFound:
            raise ConfigError(
                f"party B no longer knows run {local.remote_id} ({local.name}); "
                "choose a new [run] name or another state directory"
            ) from None

    def _restore(self) -> None:
        """The bottom model from the newest local checkpoint (a first one for a new run)."""
        assert self.local is not None
        checkpoint = self.store.load_checkpoint(self.local.id)
        if checkpoint is None:
            model_state, optimizer_state = self.bottom.state()
            self.store.save_checkpoint(
                self.local.id, 0, model_state, optimizer_state, keep=CHECKPOINTS_KEPT
            )
            return
        self.bottom.load_state(checkpoint.model_state, checkpoint.optimizer_state)
        self.step = checkpoint.step
        self.store.forget_after(self.local.id, checkpoint.step)
        if self.step:
            phase("restored party A's checkpoint at step %d", self.step)

    def _fingerprint(self) -> dict[str, Any]:
        """The config a local run is found again by. Settings added since at their old
        behaviour (``pipeline_depth`` = 1, no ``downlink``, torch's AdaGrad start, packed
        codewords) are left out, so that state directories written before them keep matching
        their runs."""
        run, optimizers = self.config.run, self.config.optimizer
        unset = {"device"}  # a local execution choice, never part of the run
        unset |= {"pipeline_depth"} if run.pipeline_depth == 1 else set()
        unset |= {"downlink"} if run.downlink is None else set()
        unset |= {"party"} if run.party is None else set()
        exclude: dict[str, Any] = {"run": unset}
        if self.config.quantizer.codewords == "packed":
            exclude["quantizer"] = {"codewords"}
        exclude["data"] = self.config.data.unset_preparation()  # keys added for categories
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

    def _split(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return split_train_eval(
            n,
            seed=self.config.run.seed,
            eval_fraction=self.config.run.eval_fraction,
            version=self.schedule_version,
        )

    def _batch_schedule(self) -> BatchSchedule:
        assert self.data is not None
        run = self.config.run
        n = len(self.data.train_pos)
        if run.schedule.kind == "shuffle":
            return make_schedule(
                n=n, batch_size=run.batch_size, seed=run.seed, version=self.schedule_version
            )
        groups = self.features.groups
        if groups is None:
            raise ConfigError(
                "the 'clients' schedule needs the client of every row: set [data] group_column"
            )
        return make_schedule(
            n=n,
            batch_size=run.batch_size,
            seed=run.seed,
            clients=[groups[r] for r in self.data.rows[self.data.train_pos].tolist()],
            clients_per_step=run.schedule.clients_per_step,
            version=self.schedule_version,
        )

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
        settings = LoopSettings(run.steps, run.pipeline_depth, run.checkpoint_interval)
        try:
            run_steps(self, settings, summary, self.on_step)
            while run.party is not None and not self._finished_by_every_party():
                run_steps(self, settings, summary, self.on_step)  # another party rolled back
        finally:
            self.flush_steps()
        summary.seconds = time.perf_counter() - started
        self.view().freeze_codebook()
        return summary

    def _finished_by_every_party(self) -> bool:
        """A feature party of a run with several: training ends when every party has applied
        the last step (party B's finish meeting, docs/PROTOCOL.md 12.7). False when the run
        was rolled back meanwhile (a party that crashed before the last step): train on."""
        assert self.local is not None
        try:
            self.transport.finish(self.run_id)
        except StepOutOfOrder as exc:
            log.warning("the run went back to step %s; training on", exc.applied_step)
            return False
        self.store.update_run(self.local.id, status="finished")
        return True

    # ------------------------------------------------------------------ StepPort

    def batch(self, step: int) -> StepBatch:
        """Step ``step``'s rows as positions into the aligned list, and its chunk sizes."""
        assert self.batches is not None and self.data is not None, "call prepare() first"
        batch = self.batches.batch(step)
        return StepBatch(self.data.train_pos[batch.positions], batch.chunk_sizes)

    def forward(self, step: int, *, stash: bool) -> PendingStep:
        assert self.data is not None
        batch = self.batch(step)
        return self.bottom.request(
            step,
            self.data.inputs(batch.positions),
            batch_digest([self.data.aligned[p] for p in batch.positions]),
            chunk_sizes=batch.chunk_sizes,
            stash=stash,
        )

    def send(self, body: bytes) -> bytes:
        return self.transport.step(self.run_id, body)

    def apply(self, pending: PendingStep, answer: bytes) -> StepResult:
        result = self.bottom.apply(pending, answer)
        self.step = pending.step
        return result

    def raw_bytes(self, chunk_sizes: tuple[int, ...]) -> int:
        return _raw_request_bytes(self.cut_dim, chunk_sizes)

    def commit(self, record: StepRecord) -> None:
        """Log the step; at the run's checkpoint steps, write the checkpoint with the rows
        logged since the last one, in one transaction.

        The rows wait in memory until then (or until training stops, ``flush_steps``): a
        restart drops every row past the newest checkpoint anyway (``_restore``), so one
        written per step bought nothing but a transaction per step (~1 ms of party A's
        ~3 ms demo step under load; docs/PERFORMANCE.md, "The floor")."""
        assert self.local is not None
        self._unlogged.append(
            LocalStep(
                run_id=self.local.id,
                step=record.step,
                loss=record.loss if np.isfinite(record.loss) else None,
                bytes_sent=record.bytes_sent,
                bytes_received=record.bytes_received,
                raw_bytes=record.raw_bytes,
                step_ms=1000 * record.seconds,
            )
        )
        run = self.config.run
        if record.step % run.checkpoint_interval == 0 or record.step == run.steps:
            model_state, optimizer_state = self.bottom.state()
            self.store.save_checkpoint(
                self.local.id,
                record.step,
                model_state,
                optimizer_state,
                keep=CHECKPOINTS_KEPT,
                steps=self._unlogged,
            )
            self._unlogged = []

    def flush_steps(self) -> None:
        """Write the step-log rows logged since the last checkpoint."""
        if self._unlogged:
            self.store.log_steps(self._unlogged)
            self._unlogged = []

    def reconcile(self) -> bool:
        assert self.local is not None
        # party B as prepare() saw it, when no step has been sent since: no second GET
        remote, self._remote = self._remote, None
        for attempt in range(3):
            if remote is None:
                remote = self.transport.get_run(self.run_id)
            try:
                target = recovery.reconcile(
                    step=self.step,
                    remote=remote,
                    local_run=self.local.id,
                    store=self.store,
                    bottom=self.bottom,
                    transport=self.transport,
                )
                break
            except CheckpointNotFound:
                # another feature party rolled party B back past our target meanwhile
                if self.config.run.party is None or attempt == 2:
                    raise
                remote = None
        if target is None:
            return False
        self.step = target
        # the rolled-back steps' rows are gone from the store (forget_after): and from here
        self._unlogged = [row for row in self._unlogged if row.step <= target]
        return True

    # ================================================================== serving

    def view(self) -> inference.RunView:
        assert self.local is not None and self.data is not None, "call prepare() first"
        return inference.RunView(
            local=self.local,
            bottom=self.bottom,
            store=self.store,
            transport=self.transport,
            data=self.data,
            step=self.step,
            batch_size=self.config.run.batch_size,
            model=self.config.run.model,
            party=self.config.run.party,
        )

    def evaluate(self, split: str = "eval", *, raw: bool = False) -> codec.EvaluateResponse:
        """Metrics of the held-out (or train) samples, computed at party B."""
        return inference.evaluate(self.view(), split, raw=raw)

    def predict(self, ids: list[str], *, raw: bool = False) -> codec.PredictResponse:
        """Party B's scores for ``ids``, each independent of the others."""
        return inference.predict(self.view(), self.features, self.common_ids(), ids, raw=raw)

    def common_ids(self) -> set[str]:
        """The ids of the feature table party B holds (the private set intersection, cached
        in party A's state): the only ones predict may send."""
        common = known_intersection(
            self.features.ids, transport=self.transport, store=self.store, server=self.server
        )
        return set(common.intersection)

    def finish(self) -> RunOut:
        assert self.local is not None
        remote = self.transport.finish(self.run_id)
        self.store.update_run(self.local.id, status="finished")
        return remote

    def close(self) -> None:
        """Close the transport (if it has connections) and the local database."""
        self.flush_steps()
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()
        self.store.close()


def _no_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Serving from a stored codebook reads no positions of the training split."""
    del n
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty
