"""What the run's policy lets ``predict`` answer: ids of its training split or not.

Under label DP the model is post-processing of the randomized labels, so its scores for the
rows it trained on are covered by the run's epsilon, and ``predict`` answers for any id.
Without label DP those scores are a direct view of what the model memorised of the training
labels (docs/PRIVACY.md measured 0.76 AUC on default_credit and 0.995 on breast from them),
so ``predict`` refuses the training split's ids unless the policy says
``predict_train_ids=true``. The refusal binds ids, not activations: party A can send a
training row's activations under another id; the side features party B joins to it are
then the other row's. docs/PRIVACY.md, section 4, says what that leaves open.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from api_schemas import ProblemType
from party_b.errors import ProblemError

if TYPE_CHECKING:
    from party_b.service.runstate import RunState

__all__ = ["refuse_training_ids"]


def refuse_training_ids(state: "RunState", hashed_hex: Sequence[str]) -> None:
    """Raise ``privacy-refused`` (403) if the run's policy does not answer for training ids
    and ``hashed_hex`` (the request's aligned keys, hex) holds any."""
    if state.privacy.policy.answers_training_ids:
        return
    if state.train_keys is None:  # built once per run in memory; a race only builds it twice
        state.train_keys = frozenset(state.aligned[p].hex() for p in state.train_pos)
    training = sum(1 for h in hashed_hex if h.lower() in state.train_keys)
    if training:
        raise ProblemError(
            ProblemType.PRIVACY_REFUSED,
            f"{training} of {len(hashed_hex)} ids belong to the run's training split; party "
            "B's privacy policy for this run does not score them (no label DP: the model's "
            "scores on its training rows give their labels away)",
            training_ids=training,
        )
