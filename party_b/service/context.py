"""What every room of party B's service shares: the database, the labels, the limits, the
metrics, the runs in memory and this replica's run leases. Built once by ``build_service``;
each room takes it whole.
"""

from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from party_b.labels import LabelSource
from party_b.metrics import Metrics
from party_b.privacy import PrivacyPolicy
from party_b.service.admission import Admission
from party_b.service.cache import RunCache
from party_b.service.fusion import PartyPlan
from party_b.service.ownership import Ownership
from party_b.settings import Limits
from shared import codec

__all__ = ["ServiceContext"]


@dataclass(frozen=True)
class ServiceContext:
    sessions: sessionmaker[Session]  # party B's database
    labels: LabelSource  # the label table (and party B's side features)
    limits: Limits  # FEDLITE_B_LIMIT_*: sizes a request or a run may take
    metrics: Metrics  # this app's Prometheus registry
    admission: Admission  # a run config against the labels and the limits
    cache: RunCache  # runs in memory, loaded once, owner-checked
    privacy: PrivacyPolicy  # the label-privacy policy new runs get
    decode_limits: codec.DecodeLimits  # bounds of every msgpack body, from ``limits``
    ownership: Ownership  # run leases: claimed on load, checked at every commit
    checkpoints_kept: int = 3  # per run, besides step 0
    step_hold: float = 5.0  # the longest wait of a step for its predecessor (one party)
    party_wait: float = 20.0  # the longest wait of a request for the other feature parties'

    def transaction(self) -> AbstractContextManager[Connection]:
        """A Core connection in a transaction, committed when the block ends (rolled back if
        it raises): a step's commit, where a session's set-up and bookkeeping cost more than
        the step-log insert it carries (docs/PERFORMANCE.md, "Steps at the limit")."""
        engine: Engine = self.sessions.kw["bind"]
        return engine.begin()

    def wait_of(self, plan: PartyPlan) -> float:
        """The longest wait in seconds of one request of a run with ``plan``'s parties (only
        a step ahead of its predecessor waits in a run with one)."""
        return self.step_hold if len(plan.names) == 1 else self.party_wait
