"""Loading a run from the store into memory: its top model at the newest checkpoint, its
aligned ids mapped to label rows, its split and batch schedule."""

import logging
import time

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import RunCreate, RunStatus
from party_b import store
from party_b.errors import ProblemError
from party_b.labels import LabelSource
from party_b.privacy import PrivacyPolicy
from party_b.privacy.run import RunPrivacy
from party_b.service.admission import Admission
from party_b.service.fusion import PartyPlan
from party_b.service.ownership import Ownership
from party_b.service.runstate import Caller, RunState, owned_row
from party_b.top import TopTrainer
from shared.alignment import hmac_ids
from shared.schedule import split_train_eval
from shared.training import state_from_bytes, state_sha256

__all__ = ["RunLoader", "key_index", "restore", "stored_model_sha256"]

log = logging.getLogger("fedlite.party_b")


class RunLoader:
    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        labels: LabelSource,
        admission: Admission,
        ownership: Ownership,
    ) -> None:
        self._sessions = sessions
        self._labels = labels
        self._admission = admission
        self._ownership = ownership

    def __call__(self, caller: Caller, run_id: str) -> RunState:
        """The state of an aligned run the caller owns, at its newest checkpoint.

        Steps logged past that checkpoint died with the process that applied them (or live on
        only in the copy of a replica that held the run before): they are dropped here, in
        the transaction that claims the run's lease and then reads the checkpoint.
        """
        started = time.perf_counter()
        with self._sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status == RunStatus.CREATED.value or run.aligned_ids is None:
                raise ProblemError.run_state("run is not aligned yet: POST its alignment first")
            spec = RunCreate.from_stored(run.config)
            trainer = self._admission.new_trainer(spec)
            built = time.perf_counter()
            lease = self._ownership.claim(session, run_id)  # first: waits for its holder's commit
            claimed = time.perf_counter()
            checkpoint = store.load_checkpoint(session, run_id)
            if checkpoint is None:
                raise ProblemError.internal(f"run {run_id} has no checkpoint")
            restore(trainer, checkpoint)
            logged_to = store.last_logged_step(session, run_id)
            lost = store.forget_after(session, run_id, checkpoint.step)
            # behind while the parties may be past the checkpoint: steps this load dropped,
            # or an earlier load's that no step has replayed yet (two takeovers in a row)
            mark = store.behind_mark(
                session, run_id, loaded_at=checkpoint.step, dropped_to=logged_to if lost else None
            )
            privacy = store.run_privacy(session, run_id)
            session.commit()
            state = self._state(run, spec, trainer)
            if privacy is not None:
                state.privacy = RunPrivacy(
                    PrivacyPolicy.from_stored(privacy.policy), privacy.secret
                )
            state.commit(checkpoint.step, checkpoint.request_sha256, checkpoint.response)
            state.lease, state.behind = lease, mark > checkpoint.step
            log.info(
                "run %s loaded at step %d (lease %d, %d logged steps past it dropped, parties "
                "up to step %d) in %.3f s: model built %.3f s, lease claimed %.3f s",
                run_id, checkpoint.step, lease, lost, mark, time.perf_counter() - started,
                built - started, claimed - built,
            )  # fmt: skip
            return state

    def _state(self, run: store.Run, spec: RunCreate, trainer: TopTrainer) -> RunState:
        assert run.aligned_ids is not None
        blob = run.aligned_ids
        aligned = [blob[i : i + 32] for i in range(0, len(blob), 32)]
        key = bytes.fromhex(run.alignment_key)
        key_to_row = key_index(key, self._labels)
        missing = sum(1 for k in aligned if k not in key_to_row)
        if missing:
            raise ProblemError.run_state(
                f"{missing} aligned ids are no longer in party B's label table; "
                "the table changed since the run was aligned"
            )
        train_pos, eval_pos = split_train_eval(
            len(aligned),
            seed=spec.seed,
            eval_fraction=spec.eval_fraction,
            version=spec.schedule_version,
        )
        label_rows = np.array([key_to_row[k] for k in aligned], dtype=np.int64)
        return RunState(
            run_id=run.id,
            owner_id=run.owner_id,
            alignment_key=key,
            config=spec,
            trainer=trainer,
            aligned=aligned,
            label_rows=label_rows,
            train_pos=train_pos,
            eval_pos=eval_pos,
            batches=self._admission.batch_schedule(spec, label_rows[train_pos]),
            # targets are (n,), (n, tags) or (n * T,): T activation rows per sample
            rows_per_sample=int(self._labels.targets(label_rows[:1]).shape[0]),
            plan=PartyPlan.of(spec),
            finished=run.status == RunStatus.FINISHED.value,
        )


def stored_model_sha256(session: Session, run_id: str, step: int) -> str | None:
    """The checksum of the top model in the run's checkpoint at ``step``, read without
    loading the run: what a read shows of a run another replica may hold. None when that
    checkpoint is not kept, or does not load as a plain state dict (logged: the run is still
    shown, and a request that needs the model gets the 500 ``restore`` explains)."""
    checkpoint = store.load_checkpoint(session, run_id, step)
    if checkpoint is None:
        return None
    try:
        return state_sha256(state_from_bytes(checkpoint.model_state))
    except Exception as exc:
        log.error("checkpoint of run %s at step %d is unreadable: %s", run_id, step, exc)
        return None


def key_index(key: bytes, labels: LabelSource) -> dict[bytes, int]:
    """Aligned key (HMAC under the run's key) -> label row, for every id party B holds."""
    return {k: row for row, k in enumerate(hmac_ids(key, labels.ids))}


def restore(trainer: TopTrainer, checkpoint: store.Checkpoint) -> None:
    """Load a checkpoint into ``trainer``; a row that is not a plain state dict is refused.

    The bytes come from our own database, but a database file can be tampered with or damaged:
    ``state_from_bytes`` unpickles with ``weights_only=True``, so a crafted row cannot run code,
    and it fails here with a clear error instead of loading.
    """
    try:
        trainer.load_state(checkpoint.model_state, checkpoint.optimizer_state)
    except Exception as exc:
        log.error(
            "checkpoint of run %s at step %d is unreadable: %s",
            checkpoint.run_id,
            checkpoint.step,
            exc,
        )
        raise ProblemError.internal(
            f"party B's checkpoint at step {checkpoint.step} of this run does not load as a "
            "plain state dict (damaged or tampered database); the operator must restore it",
        ) from None
