"""Checkpoints of party B's runs: the top model and optimizer after a step, with that step's
request digests and answers (every feature party's: ``pack_answers``).

A checkpoint is one row written in one transaction together with the pruning of older ones,
so after a crash it is either wholly there or not there. Callers commit.
"""

from collections.abc import Sequence
from typing import Any, cast

import msgpack
from sqlalchemy import CursorResult, Table, bindparam, delete, insert, select
from sqlalchemy.orm import Session

from party_b.store.engine import Database, connection_of
from party_b.store.parties import forget_party_traffic_after
from party_b.store.tables import Checkpoint, StepLog

__all__ = [
    "checkpoint_steps",
    "forget_after",
    "load_checkpoint",
    "pack_answers",
    "save_checkpoint",
    "unpack_answers",
]

_DIGEST = 32  # bytes of one request digest (SHA-256)
_TABLE = cast(Table, Checkpoint.__table__)  # a Table, as mypy can't see
_INSERT = insert(_TABLE)
_DELETE_ONE = delete(_TABLE).where(
    _TABLE.c.run_id == bindparam("run_id"), _TABLE.c.step == bindparam("step")
)
_ONE_PACKED = b"\x91"  # msgpack's array of one element: see unpack_answers


def pack_answers(digests: Sequence[bytes], answers: Sequence[bytes]) -> tuple[bytes, bytes]:
    """Every feature party's request digest and answer of one step, in party order, as the
    two values a checkpoint (and ``RunState``) keeps. One party: its digest and answer as
    they are (how runs were stored before several parties existed); several: the digests
    concatenated (32 bytes each) and a msgpack array of the answers (one ``bin`` each)."""
    if len(answers) == 1:
        return digests[0], answers[0]
    packed: bytes = msgpack.packb(list(answers), use_bin_type=True)
    return b"".join(digests), packed


def unpack_answers(
    digests: bytes | None, answers: bytes | None, parties: int
) -> list[tuple[bytes, bytes]] | None:
    """``pack_answers`` undone: (digest, answer) per party, or None for a step never answered
    (step 0) or stored in another shape."""
    if digests is None or answers is None or len(digests) != _DIGEST * parties:
        return None
    if parties == 1 and not answers.startswith(_ONE_PACKED):
        # (an answer is a msgpack map; a run created with one entry in ``parties`` stored
        # an array of one answer before one-party answers were stored as they are)
        return [(digests, answers)]
    unpacked = msgpack.unpackb(answers, raw=False)
    if not isinstance(unpacked, list) or len(unpacked) != parties:
        return None
    return [(digests[_DIGEST * i : _DIGEST * (i + 1)], bytes(a)) for i, a in enumerate(unpacked)]


def save_checkpoint(
    db: Database,
    *,
    run_id: str,
    step: int,
    model_state: bytes,
    optimizer_state: bytes,
    request_sha256: bytes | None,
    response: bytes | None,
    keep: int,
    interval: int | None = None,
) -> None:
    """Insert (or replace) the checkpoint of ``step`` and prune to the newest ``keep``.

    With ``interval`` (the run's checkpoint interval) only checkpoints at its multiples count
    towards ``keep``, and one between them survives only while it is the newest: a run
    evicted from memory at any step (``party_b.service.ownership``) must not push out the
    interval checkpoints party A rolls back to, which it keeps at the same steps.
    The caller commits; all of it lands in one transaction.
    """
    # Core statements on the transaction's connection: ``session.merge`` first loaded the row
    # through the ORM, whose loader set-up alone took 17 ms a checkpoint (docs/PERFORMANCE.md)
    connection = connection_of(db)
    connection.execute(_DELETE_ONE, {"run_id": run_id, "step": step})
    connection.execute(
        _INSERT,
        {
            "run_id": run_id,
            "step": step,
            "model_state": model_state,
            "optimizer_state": optimizer_state,
            "request_sha256": request_sha256,
            "response": response,
        },
    )
    steps = connection.scalars(
        select(_TABLE.c.step).where(_TABLE.c.run_id == run_id).order_by(_TABLE.c.step.desc())
    ).all()
    if interval is None:
        kept = list(steps[:keep])
    else:
        kept = [s for s in steps if s % interval == 0][:keep] + list(steps[:1])
    connection.execute(delete(_TABLE).where(_TABLE.c.run_id == run_id, _TABLE.c.step.not_in(kept)))


def checkpoint_steps(session: Session, run_id: str) -> list[int]:
    return list(
        session.scalars(
            select(Checkpoint.step).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)
        )
    )


def load_checkpoint(session: Session, run_id: str, step: int | None = None) -> Checkpoint | None:
    """The checkpoint of ``step``, or the newest one when ``step`` is None."""
    query = select(Checkpoint).where(Checkpoint.run_id == run_id)
    if step is None:
        query = query.order_by(Checkpoint.step.desc()).limit(1)
    else:
        query = query.where(Checkpoint.step == step)
    return session.scalars(query).first()


def forget_after(session: Session, run_id: str, step: int) -> int:
    """Drop step-log rows and checkpoints past ``step``: that future was rolled back.
    Returns how many logged steps were dropped."""
    dropped = session.execute(delete(StepLog).where(StepLog.run_id == run_id, StepLog.step > step))
    session.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step > step))
    forget_party_traffic_after(session, run_id, step)  # a run with parties: per party
    return int(cast(CursorResult[Any], dropped).rowcount)
