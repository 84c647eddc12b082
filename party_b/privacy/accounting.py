"""Privacy accounting: the label-DP epsilon each run spends, per run and per party A token.

A run under label DP spends its policy's epsilon of party B's labels, once, whatever it
does after (``label_dp``); a run without label DP gives no formal bound (its spend is
unbounded). Runs of one token over the same labels compose by basic composition: each run
draws its randomized labels afresh from its own secret, so k runs at eps_1..eps_k release
(eps_1 + ... + eps_k)-label-DP views of every label to that token (docs/PRIVACY.md, section
2). The ledger (``party_b.store``: table ``privacy_ledger``) records each run's spend when
the run is created, and keeps it when the run is deleted: what party A received stays
received. An operator may cap a token's total (``fedlite-b token budget``); a creation that
would pass the cap is refused with problem ``privacy-budget-exceeded``, and nothing is
stored.
"""

import logging
import math
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api_schemas import ProblemType
from party_b import store
from party_b.errors import ProblemError
from party_b.privacy.policy import PrivacyPolicy

__all__ = ["Spent", "charge", "run_privacy_json", "spent"]

log = logging.getLogger("fedlite.party_b")


@dataclass(frozen=True)
class Spent:
    """A token's spend: ``epsilon``, the sum over its runs that have a bound; ``unbounded``,
    how many of its runs have none; ``runs``, all its runs (deleted ones included);
    ``budget``, the operator's cap (None: no cap)."""

    epsilon: float
    unbounded: int
    runs: int
    budget: float | None

    @property
    def total(self) -> float:
        """The token's epsilon over all its runs: infinite once one run had no bound."""
        return math.inf if self.unbounded else self.epsilon

    def as_json(self) -> dict[str, object]:
        return {
            "epsilon_spent": None if self.unbounded else self.epsilon,
            "epsilon_of_bounded_runs": self.epsilon,
            "runs": self.runs,
            "runs_without_bound": self.unbounded,
            "epsilon_budget": self.budget,
        }


def spent(session: Session, owner_id: int, *, creating: str | None = None) -> Spent:
    """What the token's runs have spent; runs created before the ledger existed count by the
    policy stored with them (none stored: they trained as off, unbounded). ``creating``: a
    run added in this session and not yet charged, left out."""
    epsilons: list[float | None] = [row.epsilon for row in store.ledger_of(session, owner_id)]
    for _run_id, stored in store.runs_before_ledger(session, owner_id, exclude=creating):
        epsilons.append(PrivacyPolicy.from_stored(stored).epsilon if stored else None)
    bounded = [e for e in epsilons if e is not None]
    return Spent(
        epsilon=math.fsum(bounded),
        unbounded=len(epsilons) - len(bounded),
        runs=len(epsilons),
        budget=store.privacy_budget(session, owner_id),
    )


def charge(session: Session, *, owner_id: int, run_id: str, policy: PrivacyPolicy) -> None:
    """Record the spend of a run being created in this session (before its commit), or
    raise ``privacy-budget-exceeded`` (403) when it would take the token past its budget."""
    before = spent(session, owner_id, creating=run_id)
    cost = policy.epsilon
    if before.budget is not None:
        after = before.epsilon + cost if cost is not None else math.inf
        if before.unbounded or after > before.budget + 1e-12:
            raise ProblemError(
                ProblemType.PRIVACY_BUDGET_EXCEEDED,
                _refusal(before, cost),
                epsilon_spent=None if before.unbounded else before.epsilon,
                epsilon_budget=before.budget,
                epsilon_run=cost,
            )
    store.add_ledger_entry(
        session, run_id=run_id, owner_id=owner_id, epsilon=cost, policy=policy.describe()
    )
    log.info(
        "run %s spends %s of token %d's labels (policy %s)",
        run_id,
        f"label-DP epsilon {cost:g}" if cost is not None else "an unbounded epsilon",
        owner_id,
        policy.describe(),
    )


def _refusal(before: Spent, cost: float | None) -> str:
    budget = f"this token's label-privacy budget is epsilon {before.budget:g}"
    if before.unbounded:
        return (
            f"{budget}, and {before.unbounded} of its runs had no label-DP bound (their "
            "spend is unbounded): party B's operator decides whether it may train again"
        )
    if cost is None:
        return (
            f"{budget}; party B gives new runs a policy without a label-DP bound, which no "
            "budget covers"
        )
    return (
        f"{budget}; its runs have spent {before.epsilon:g} and this one would spend {cost:g}, "
        f"{before.epsilon + cost:g} in all"
    )


def run_privacy_json(session: Session, run_id: str, owner_id: int) -> dict[str, object]:
    """``privacy`` (the run's policy and its spend) and ``owner_privacy`` (its token's spend
    and budget), as ``fedlite-b runs show`` and the dashboard show them."""
    from party_b.privacy.label_dp import auc_bound

    stored = store.run_privacy(session, run_id)
    policy = PrivacyPolicy.from_stored(stored.policy if stored is not None else None)
    entry = store.ledger_entry(session, run_id)
    epsilon = policy.epsilon
    return {
        "privacy": {
            "policy": policy.describe(),
            "label_dp": epsilon is not None,
            "epsilon": epsilon,
            # the ROC bound of any attack on one row's label (label_dp.auc_bound)
            "attack_auc_bound": auc_bound(epsilon) if epsilon is not None else None,
            "recorded": entry is not None,  # False: created before the ledger existed
            "predict_train_ids": policy.answers_training_ids,
        },
        "owner_privacy": spent(session, owner_id).as_json(),
    }
