"""Bringing party A and party B back to the same step after either restarted.

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

import logging

from api_schemas import RunOut
from party_a.bottom import BottomTrainer
from party_a.errors import ProtocolError
from party_a.store import LocalStore
from party_a.transport import Transport

__all__ = ["reconcile"]

log = logging.getLogger("fedlite.party_a")


def reconcile(
    *,
    step: int,
    remote: RunOut,
    local_run: int,
    store: LocalStore,
    bottom: BottomTrainer,
    transport: Transport,
) -> int | None:
    """Party A at ``step`` against party B as ``remote`` shows it: None when they agree (or
    party B will replay its stored answer for ``step + 1``); else the step both now stand at,
    after ``bottom`` was restored from the newest common checkpoint, the local store
    forgot what came after it, and party B was asked to resume from it."""
    if remote.step in (step, step + 1):
        return None
    local_steps = store.checkpoint_steps(local_run)
    common = [s for s in local_steps if s in remote.checkpoints and s <= min(step, remote.step)]
    if not common:
        raise ProtocolError(
            f"no common checkpoint: party A has {local_steps} (at step {step}), "
            f"party B has {remote.checkpoints} (at step {remote.step})"
        )
    target = max(common)
    checkpoint = store.load_checkpoint(local_run, target)
    assert checkpoint is not None
    bottom.load_state(checkpoint.model_state, checkpoint.optimizer_state)
    store.forget_after(local_run, target)
    if remote.step != target:
        transport.resume(remote.id, target)
    log.warning(
        "rolled back to step %d (party A was at %d, party B at %d)", target, step, remote.step
    )
    return target
