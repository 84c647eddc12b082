"""Party B without HTTP: one room per job, sharing one ``ServiceContext``.

    context.py     ServiceContext: database, labels, limits, metrics, runs in memory, policy
    runstate.py    Caller, RunState (a run in memory), owned_row (the one ownership check)
    cache.py       RunCache: runs in memory, loaded once, looked up by owner and id
    bounds.py      LiveBounds: how many runs (and bytes) stay in memory, LRU first out
    ownership.py   Ownership: this replica's run leases (claim on load, fence each commit,
                   park a run that leaves memory)
    loader.py      RunLoader: a run from the store into memory, at its newest checkpoint
    admission.py   Admission: a run config checked against the labels and the limits
    runs.py        Runs: create (quota, idempotency), list, show, finish, logs, recovery
    alignment.py   Alignment: PSI and aligning a run on the intersection
    steps.py       Steps: exactly-once training steps, each a transaction; resume
    turns.py       Turns: a step that overtook its predecessor waits for it (event loop)
    activations.py request bodies to z~ (decode: 400, dequantize: 422)
    answer.py      the step's gradient back to party A in the run's downlink
    serving.py     Serving: evaluate and predict
    views.py       RunOut / AlignmentOut
    parties.py     Parties: a run with several feature parties (docs/PROTOCOL.md 12)
    meetings.py    Meetings: where those parties' requests wait for each other (event loop)
    fusion.py      their plan, fused activations, sliced gradients, packed answers

``Service`` is the rooms, nothing more: the API's routes (``party_b.api``) and
``party_b.inprocess`` call the room they need (``service.steps.step(...)``), in worker
threads since they do torch work, and render ``ProblemError`` as problem+json.
"""

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service.activations import decode_limits
from party_b.service.admission import Admission
from party_b.service.alignment import Aligner, Alignment
from party_b.service.bounds import LiveBounds
from party_b.service.cache import RunCache
from party_b.service.context import ServiceContext
from party_b.service.loader import RunLoader
from party_b.service.meetings import Meetings
from party_b.service.ownership import Ownership
from party_b.service.parties import Parties
from party_b.service.runs import Runs
from party_b.service.runstate import Caller
from party_b.service.serving import Serving
from party_b.service.steps import Steps
from party_b.service.turns import HOLD_SECONDS, Turns
from party_b.settings import Limits

__all__ = ["Caller", "LiveBounds", "Service", "ServiceContext", "build_service"]


@dataclass(frozen=True)
class Service:
    """Every operation of party B's API, without HTTP, by room; each raises ``ProblemError``."""

    context: ServiceContext
    loader: RunLoader  # what the context's cache loads a run with
    runs: Runs
    alignment: Alignment
    steps: Steps
    turns: Turns
    serving: Serving
    parties: Parties  # runs with several feature parties
    meetings: Meetings


def build_service(
    *,
    sessions: sessionmaker[Session],
    labels: LabelSource,
    limits: Limits,
    metrics: Metrics,
    checkpoints_kept: int = 3,
    aligner: Aligner | None = None,
    privacy: PrivacyPolicy | None = None,
    step_hold: float | None = None,
    bounds: LiveBounds | None = None,
    replica_id: str | None = None,
    party_wait: float = 20.0,
) -> Service:
    """The rooms over one context. ``privacy``: the label-privacy policy every new run gets
    (default: off); ``step_hold``: the longest wait in seconds of a step that overtook its
    predecessor (default ``turns.HOLD_SECONDS``; 0 refuses it at once); ``bounds``: the
    training runs kept in memory (default: no bound); ``replica_id``: this process's name
    in the run leases (default ``ownership.default_holder()``); ``party_wait``: the longest
    wait of a feature party's request for the other parties' (seconds)."""
    privacy = privacy or PrivacyPolicy()
    privacy.check_labels(labels.task, labels.num_outputs)
    admission = Admission(labels, limits)
    ownership = Ownership(sessions, holder=replica_id, checkpoints_kept=checkpoints_kept)
    loader = RunLoader(sessions=sessions, labels=labels, admission=admission, ownership=ownership)
    cache = RunCache(
        loader, metrics, bounds or LiveBounds(), park=ownership.park, verify=ownership.current
    )
    ctx = ServiceContext(
        sessions=sessions,
        labels=labels,
        limits=limits,
        metrics=metrics,
        admission=admission,
        cache=cache,
        privacy=privacy,
        decode_limits=decode_limits(limits),
        ownership=ownership,
        checkpoints_kept=checkpoints_kept,
    )
    runs, alignment, steps, serving = Runs(ctx), Alignment(ctx, aligner), Steps(ctx), Serving(ctx)
    return Service(
        context=ctx,
        loader=loader,
        runs=runs,
        alignment=alignment,
        steps=steps,
        turns=Turns(
            cache,
            metrics,
            HOLD_SECONDS if step_hold is None else step_hold,
            limits=ctx.decode_limits,
        ),
        serving=serving,
        parties=Parties(ctx, runs, steps, alignment, serving),
        meetings=Meetings(party_wait),
    )
