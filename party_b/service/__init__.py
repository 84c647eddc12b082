"""Party B without HTTP: one room per job, sharing one ``ServiceContext``.

    context.py     ServiceContext: database, labels, limits, metrics, runs in memory, policy
    runstate.py    RunState (a run in memory), owned_row (the one ownership check), party_of
    fusion.py      PartyPlan (a run's N >= 1 feature parties), fusing z~, slicing gradients
    cache.py       RunCache: runs in memory, loaded once, looked up by owner and id
    bounds.py      LiveBounds: how many runs (and bytes) stay in memory, LRU first out
    ownership.py   Ownership: this replica's run leases (claim on load, fence each commit,
                   park a run that leaves memory)
    loader.py      RunLoader: a run from the store into memory, at its newest checkpoint
    admission.py   Admission: a run config checked against the labels and the limits
    runs.py        Runs: create (quota, idempotency), list, show, finish, logs, recovery
    alignment.py   Alignment: PSI and aligning a run on the intersection
    steps.py       Steps: exactly-once training steps, each a transaction; resume
    serving.py     Serving: evaluate and predict
    meetings.py    Meetings: where requests wait, for a predecessor step or other parties
    activations.py request bodies to z~ (decode: 400, dequantize: 422)
    answer.py      a step's gradient back to a party in its downlink
    views.py       RunOut / AlignmentOut

Every run has N >= 1 feature parties: a run created by a token has one, a run created with
``parties`` several (docs/PROTOCOL.md section 12), and one code serves both. A room checks
one party's request (``steps.check``, ``serving.evaluate``, ...) and returns its answer, or a
``meetings.Ticket`` that waits in ``Meetings`` until the other parties' parts (or its
predecessor step) are in. ``Service`` is the rooms, nothing more: the API's routes
(``party_b.api``) and ``party_b.inprocess`` call the room they need, in worker threads since
they do torch work, and render ``ProblemError`` as problem+json.
"""

from dataclasses import dataclass
from functools import partial

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
from party_b.service.meetings import Meetings, Ticket
from party_b.service.ownership import Ownership
from party_b.service.runs import Runs
from party_b.service.runstate import Caller
from party_b.service.serving import Serving
from party_b.service.steps import Steps
from party_b.settings import Limits

__all__ = ["Caller", "LiveBounds", "Service", "ServiceContext", "Ticket", "build_service"]

# The default longest wait of a step for its predecessor, in seconds (FEDLITE_B_STEP_HOLD_SECONDS;
# 0 turns it off): long enough for a predecessor that left party A a moment earlier on another
# connection (a WAN's jitter, a TLS handshake, a wait for a worker thread behind other runs'
# steps), short enough that a predecessor that never comes delays party A's usual 409 path by
# a few seconds only, far below its request timeout (120 s, party_a/transport/http.py).
HOLD_SECONDS = 5.0


@dataclass(frozen=True)
class Service:
    """Every operation of party B's API, without HTTP, by room; each raises ``ProblemError``."""

    context: ServiceContext
    loader: RunLoader  # what the context's cache loads a run with
    runs: Runs
    alignment: Alignment
    steps: Steps
    serving: Serving
    meetings: Meetings  # where requests wait (event loop)


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
    predecessor (default ``HOLD_SECONDS``; 0 refuses it at once); ``bounds``: the
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
        step_hold=HOLD_SECONDS if step_hold is None else step_hold,
        party_wait=party_wait,
    )
    return Service(
        context=ctx,
        loader=loader,
        runs=Runs(ctx),
        alignment=Alignment(ctx, aligner),
        steps=Steps(ctx),
        serving=Serving(ctx),
        meetings=Meetings(on_wait=partial(_held, metrics)),
    )


def _held(metrics: Metrics, ticket: Ticket) -> None:
    """A step that waits (for its predecessor, or the other parties) is counted as held."""
    if ticket.agenda.step is not None:
        metrics.steps.labels("held").inc()
