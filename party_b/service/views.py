"""What the JSON API shows of a run: ``RunOut`` and ``AlignmentOut`` from stored rows."""

import math

from sqlalchemy.orm import Session

from api_schemas import AlignmentOut, RunCreate, RunOut, RunPrivacyOut, RunStatus
from api_schemas.runs import AlignmentInfo
from party_b import store
from party_b.labels import LabelSource, class_names
from party_b.privacy import PrivacyPolicy
from party_b.privacy.label_dp import keep_probability
from party_b.service.runstate import RunState

__all__ = ["alignment_out", "finite_or_none", "run_out"]


def run_out(session: Session, run: store.Run, live: RunState | None, labels: LabelSource) -> RunOut:
    """The run as the API shows it; ``live``: its state in memory, whose step is newer than
    the newest checkpoint; ``labels``: party B's label source (its classes' names)."""
    checkpoints = store.checkpoint_steps(session, run.id)
    step = live.step if live is not None else (checkpoints[-1] if checkpoints else 0)
    alignment = None
    if run.aligned_ids is not None and run.train_size is not None:
        alignment = AlignmentInfo(
            aligned=len(run.aligned_ids) // 32, train=run.train_size, eval=run.eval_size or 0
        )
    return RunOut(
        id=run.id,
        name=run.name,
        status=RunStatus(run.status),
        config=RunCreate.from_stored(run.config),
        created_at=run.created_at,
        step=step,
        checkpoints=checkpoints,
        alignment_key=run.alignment_key,
        alignment=alignment,
        num_classes=run.num_classes,
        classes=class_names(labels, run.num_classes),
        side_features=run.side_features,
        privacy=privacy_out(_policy(session, run.id, live), run.num_classes),
    )


def privacy_out(policy: PrivacyPolicy, num_classes: int) -> RunPrivacyOut:
    epsilon = policy.label_epsilon
    plain = epsilon is not None and not policy.prior_fraction and num_classes > 1
    return RunPrivacyOut(
        policy=policy.describe(),
        label_dp=epsilon is not None,
        epsilon=policy.epsilon,
        label_keep=keep_probability(epsilon, num_classes) if plain and epsilon else None,
        metrics=policy.metrics,
        predict_train_ids=policy.answers_training_ids,
    )


def _policy(session: Session, run_id: str, live: RunState | None) -> PrivacyPolicy:
    """The run's policy: its copy in memory's, else the stored one (a run stored before
    policies trains as off)."""
    if live is not None:
        return live.privacy.policy
    stored = store.run_privacy(session, run_id)
    return PrivacyPolicy.from_stored(stored.policy if stored else None)


def alignment_out(run: store.Run, aligned: list[bytes]) -> AlignmentOut:
    return AlignmentOut(
        intersection=[k.hex() for k in aligned], train=run.train_size or 0, eval=run.eval_size or 0
    )


def finite_or_none(value: float) -> float | None:
    """A loss or metric as stored and shown in JSON: None where it is NaN or infinite."""
    return value if math.isfinite(value) else None
