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

from collections.abc import Callable, Sequence

from api_schemas import ProblemType
from party_b.errors import ProblemError
from party_b.privacy.policy import PrivacyPolicy

__all__ = ["refuse_training_ids"]


def refuse_training_ids(
    policy: PrivacyPolicy, training_keys: Callable[[], frozenset[str]], hashed_hex: Sequence[str]
) -> None:
    """Raise ``privacy-refused`` (403) if the run's ``policy`` does not answer for training
    ids and ``hashed_hex`` (the request's aligned keys, hex) holds any of ``training_keys()``
    (the run's training split, hex; asked only when the policy refuses them)."""
    if policy.answers_training_ids:
        return
    keys = training_keys()
    training = sum(1 for h in hashed_hex if h.lower() in keys)
    if training:
        raise ProblemError(
            ProblemType.PRIVACY_REFUSED,
            f"{training} of {len(hashed_hex)} ids belong to the run's training split; party "
            "B's privacy policy for this run does not score them (no label DP: the model's "
            "scores on its training rows give their labels away)",
            training_ids=training,
        )
