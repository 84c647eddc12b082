"""Privacy accounting: the label-DP epsilon a token's runs spend, against its budget.

A run under label DP trains on the randomized labels of its label table's draw
(``party_b.privacy.draws``): every run on one draw releases post-processing of the same
randomized response of each label, so a token spends a draw's epsilon once, however many
runs it makes on it (docs/PRIVACY.md, section 2.4). What still composes, by basic
composition, is a new draw (another epsilon or mechanism, a changed table, an operator's
redraw), a run created before draws existed (its labels came from its own secret: its
epsilon counts on its own), and a run without label DP, whose spend is unbounded.

The ledger (``party_b.store``: tables ``privacy_ledger`` and ``run_label_draws``) records
each run when it is created, and keeps the record when the run is deleted: what party A
received stays received. Every token has a budget: the operator's cap (``fedlite-b token
budget``), else party B's default (``FEDLITE_B_LIMIT_EPSILON_BUDGET``), which covers what
label-DP draws spend and leaves runs without label DP to the operator's explicit choice. A
creation that would take the token past its budget is refused with problem
``privacy-budget-exceeded``, and nothing is stored.
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
    """A token's spend: ``epsilon``, the sum over its label draws (each once) and over its
    runs that drew their own labels; ``unbounded``, how many of its runs have no bound;
    ``runs``, all its runs (deleted ones included); ``draws``, the label draws its runs
    used; ``budget``, its cap, the operator's (``budget_is_default`` False) or party B's
    default (True), None for none."""

    epsilon: float
    unbounded: int
    runs: int
    draws: frozenset[int]
    budget: float | None
    budget_is_default: bool = False

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
            "label_draws": len(self.draws),
            "epsilon_budget": self.budget,
            "epsilon_budget_is_default": self.budget_is_default,
        }


def spent(
    session: Session,
    owner_id: int,
    *,
    creating: str | None = None,
    default_budget: float | None = None,
) -> Spent:
    """What the token's runs have spent. Runs created before the ledger existed count by the
    policy stored with them (none stored: they trained as off, unbounded). ``creating``: a
    run added in this session and not yet charged, left out; ``default_budget``: the budget
    of a token the operator gave none (None or 0: no default)."""
    entries = store.ledger_of(session, owner_id)
    drawn = store.draws_of_runs(session, [entry.run_id for entry in entries])
    own: list[float | None] = []
    draws: dict[int, float] = {}
    for entry in entries:
        draw = drawn.get(entry.run_id)
        if draw is not None:
            draws[draw.id] = draw.epsilon
        else:
            own.append(entry.epsilon)
    for _run_id, stored in store.runs_before_ledger(session, owner_id, exclude=creating):
        own.append(PrivacyPolicy.from_stored(stored).epsilon if stored else None)
    bounded = [e for e in own if e is not None] + list(draws.values())
    cap = store.privacy_budget(session, owner_id)
    default = default_budget if cap is None and default_budget else None
    return Spent(
        epsilon=math.fsum(bounded),
        unbounded=sum(1 for e in own if e is None),
        runs=len(own) + len(drawn),
        draws=frozenset(draws),
        budget=cap if cap is not None else default,
        budget_is_default=default is not None,
    )


def charge(
    session: Session,
    *,
    owner_id: int,
    run_id: str,
    policy: PrivacyPolicy,
    draw: "store.LabelDraw | None" = None,
    default_budget: float | None = None,
) -> None:
    """Record the spend of a run being created in this session (before its commit), whose
    labels come from ``draw`` (None: its own draws, or no label DP), or raise
    ``privacy-budget-exceeded`` (403) when it would take the token past its budget: the
    operator's cap, else ``default_budget``, which does not refuse runs without label DP
    (an operator who serves ``off`` chose that, and it is logged)."""
    before = spent(session, owner_id, creating=run_id, default_budget=default_budget)
    cost = policy.epsilon
    if draw is not None:
        cost = 0.0 if draw.id in before.draws else draw.epsilon  # a draw is spent once
    budget = before.budget
    if budget is not None and (cost is not None or not before.budget_is_default):
        already = before.epsilon if before.budget_is_default else before.total
        after = already + cost if cost is not None else math.inf
        if after > budget + 1e-12:
            raise ProblemError(
                ProblemType.PRIVACY_BUDGET_EXCEEDED,
                _refusal(before, cost),
                epsilon_spent=None if math.isinf(already) else already,
                epsilon_budget=budget,
                epsilon_run=cost,
            )
    store.add_ledger_entry(
        session, run_id=run_id, owner_id=owner_id, epsilon=policy.epsilon, policy=policy.describe()
    )
    if draw is not None:
        store.link_run_to_draw(session, run_id, draw.id)
    log.info(
        "run %s spends %s of token %d's labels (policy %s)",
        run_id,
        "an unbounded epsilon"
        if cost is None
        else f"label-DP epsilon {cost:g}"
        + ("" if draw is None else f" (label draw {draw.id}, epsilon {draw.epsilon:g})"),
        owner_id,
        policy.describe(),
    )


def _refusal(before: Spent, cost: float | None) -> str:
    budget = f"this token's label-privacy budget is epsilon {before.budget:g}" + (
        " (party B's default for a token without its own: FEDLITE_B_LIMIT_EPSILON_BUDGET; "
        "the operator sets one with 'fedlite-b token budget')"
        if before.budget_is_default
        else ""
    )
    if before.unbounded and not before.budget_is_default:
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
        f"{before.epsilon + cost:g} in all (a run on a label draw the token has used spends "
        "nothing more: a new draw, another epsilon or a changed label table spends anew)"
    )


def run_privacy_json(
    session: Session, run_id: str, owner_id: int, *, default_budget: float | None = None
) -> dict[str, object]:
    """``privacy`` (the run's policy, its spend and where its randomized labels come from)
    and ``owner_privacy`` (its token's spend and budget, ``default_budget`` where the
    operator gave it none), as ``fedlite-b runs show`` and the dashboard show them."""
    from party_b.privacy.label_dp import auc_bound

    stored = store.run_privacy(session, run_id)
    policy = PrivacyPolicy.from_stored(stored.policy if stored is not None else None)
    entry = store.ledger_entry(session, run_id)
    draw = store.draw_of_run(session, run_id)
    epsilon = policy.epsilon
    labels = None
    if epsilon is not None:
        labels = (
            {
                "drawn": "once per label table",
                "draw": draw.id,
                "generation": draw.generation,
                "drawn_at": draw.created_at.isoformat(),
                "retired": draw.retired_at is not None,
            }
            if draw is not None
            else {"drawn": "once for this run (created before label draws)"}
        )
    return {
        "privacy": {
            "policy": policy.describe(),
            "label_dp": epsilon is not None,
            "epsilon": epsilon,
            # the ROC bound of any attack on one row's label (label_dp.auc_bound)
            "attack_auc_bound": auc_bound(epsilon) if epsilon is not None else None,
            "randomized_labels": labels,
            "recorded": entry is not None,  # False: created before the ledger existed
            "predict_train_ids": policy.answers_training_ids,
        },
        "owner_privacy": spent(session, owner_id, default_budget=default_budget).as_json(),
    }
