"""Write big checkpoints in a loop through the real stores, for a test that kills us mid-write.

    python -m tests.utils.checkpoint_writer {a|b} DATABASE

Continues after the newest checkpoint already in DATABASE. Prints ``begin N`` before it writes
the checkpoint of step N and ``committed N`` after the commit. The
content of every checkpoint is a function of its step (``payload``), so a reader can tell a
whole checkpoint from a torn one.

``FEDLITE_TEST_STALL=before-commit:N`` (or ``after-commit:N``) makes it print ``stalled N``
and wait to be killed at that point of step N's write: after every row of the checkpoint is
flushed into the open transaction, just before the commit (or just after it), so that a test
can kill it on a chosen side of a commit and not only at random moments.
"""

import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

KEEP = 3
SIZE = 4 * 2**20  # bytes per state blob: big enough that a commit takes a while


_current_step = [0]


def _stall(step: int) -> None:
    print(f"stalled {step}", flush=True)
    time.sleep(3600)  # until the test kills us


def _install_stall() -> tuple[str, int] | None:
    spec = os.environ.get("FEDLITE_TEST_STALL")
    if not spec:
        return None
    where, step = spec.split(":")
    if where == "before-commit":
        real_commit = Session.commit

        def commit(session: Session) -> None:
            if _current_step[0] == int(step):
                session.flush()  # every row is in the transaction; only the commit is left
                _stall(int(step))
            real_commit(session)

        Session.commit = commit  # type: ignore[method-assign]
    return where, int(step)


def _after_commit(stall: tuple[str, int] | None, step: int) -> None:
    print(f"committed {step}", flush=True)
    if stall == ("after-commit", step):
        _stall(step)


def payload(step: int, part: str) -> bytes:
    block = hashlib.sha256(f"{part}:{step}".encode()).digest()
    return block * (SIZE // len(block))


def write_party_b(database: Path) -> None:
    from party_b import store

    engine = store.make_engine(f"sqlite:///{database}")
    sessions = store.make_session_factory(engine)
    with sessions() as session:
        if session.get(store.Run, "r") is None:
            session.add(store.ApiToken(id=1, name="t", token_sha256="0" * 64))
            session.add(
                store.Run(
                    id="r", owner_id=1, name="r", status="training", config={},
                    alignment_key="00", num_classes=2, side_features=0,
                )
            )  # fmt: skip
            session.commit()
        steps = store.checkpoint_steps(session, "r")

    def save(step: int) -> None:
        with sessions() as session:
            store.save_checkpoint(
                session,
                run_id="r",
                step=step,
                model_state=payload(step, "model"),
                optimizer_state=payload(step, "optimizer"),
                request_sha256=hashlib.sha256(str(step).encode()).digest(),
                response=None,
                keep=KEEP,
            )
            session.commit()

    _write_forever(steps[-1] if steps else 0, save)


def write_party_a(database: Path) -> None:
    from party_a.store import LocalRun, LocalStore

    local = LocalStore(f"sqlite:///{database}")
    run = local.find_run("s", "r") or local.add_run(
        LocalRun(server="s", name="r", remote_id="r", config={}, alignment_key="00")
    )
    steps = local.checkpoint_steps(run.id)

    def save(step: int) -> None:
        local.save_checkpoint(
            run.id, step, payload(step, "model"), payload(step, "optimizer"), keep=KEEP
        )

    _write_forever(steps[-1] if steps else 0, save)


def _write_forever(last: int, save: Callable[[int], None]) -> None:
    """Checkpoints last+1, last+2, ... through ``save``, announcing each (see the docstring)."""
    stall = _install_stall()
    step = last
    while True:
        step += 1
        _current_step[0] = step
        print(f"begin {step}", flush=True)
        save(step)
        _after_commit(stall, step)


if __name__ == "__main__":
    side, database = sys.argv[1], Path(sys.argv[2])
    (write_party_b if side == "b" else write_party_a)(database)
