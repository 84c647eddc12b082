"""Randomized labels drawn once per label table, not once per run.

A run under label DP trains on randomized labels (``label_dp``). Were each run to draw them
afresh, k runs over the same ids would give party A k independent randomized responses of
every label, which it can majority-vote (an audit read breast's labels at AUC 0.94 from 40
runs; docs/PRIVACY.md, section 5). So each id's randomized label is a keyed function of

- a **draw**: party B's secret for this label table and mechanism (table ``label_draws``),
  made when the first run on the table needs it and replaced only by the operator
  (``fedlite-b privacy redraw``);
- the **table's identity**: a content digest of its labelled ids and their labels
  (``table_digest``; never sent), so that a changed table gets independent draws instead of
  the same coins, which would show party A exactly which labels changed;
- the **id** itself, not its row in the file: a run over a subset, a re-created or deleted
  run, another feature party or another ordering of the file gets the same label for an id.

Every run on the table then releases post-processing of one randomized response per label:
together they are eps-label-DP, eps the draw's epsilon, however many there are
(docs/PRIVACY.md, section 2.2, has the proof sketch). What still composes is a new draw: a
new mechanism (another ``label_epsilon`` or ``prior_fraction``), a changed table or a
redraw; the ledger counts each draw once per token (``accounting``).

Runs created before draws existed keep drawing from their own secret by row (their stored
secret is 32 bytes: ``secret.RunPrivacy``), so they train, and recover, exactly as before.
"""

import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.orm import Session, sessionmaker

from party_b import store
from party_b.privacy import secret as run_secrets
from party_b.privacy.policy import PrivacyPolicy

if TYPE_CHECKING:
    from party_b.labels import LabelSource

__all__ = [
    "RunDraw",
    "TableIdentity",
    "draw_key",
    "id_codes",
    "mechanism",
    "table_digest",
    "table_draw",
]

_CACHED = 8  # label tables whose id codes are kept in memory (one per draw, usually one)
_codes: "OrderedDict[bytes, tuple[Sequence[str], NDArray[np.uint64]]]" = OrderedDict()
_codes_lock = threading.Lock()


def mechanism(policy: PrivacyPolicy) -> str:
    """What a draw's labels depend on besides the secret, table and id: runs whose policies
    agree on it share a draw (``label_epsilon=1`` with or without other fields alike)."""
    assert policy.label_epsilon is not None, "a draw is of label DP"
    text = f"label_epsilon={policy.label_epsilon!r}"
    return text + (f",prior_fraction={policy.prior_fraction!r}" if policy.prior_fraction else "")


def table_digest(ids: Sequence[str], targets: NDArray[np.int64]) -> str:
    """A content hash of a label table (hex SHA-256): its labelled ids and their class
    indices (``targets`` (n,), -1 for a row without a label, which is left out: rows added
    only to be scored do not change the table). Independent of the rows' order; equal iff
    the labelled (id, label) pairs are equal."""
    labelled = sorted((ids[i], int(targets[i])) for i in range(len(ids)) if targets[i] >= 0)
    h = hashlib.sha256(b"fedlite-vfl label table v1\0")
    for identity, label in labelled:
        data = identity.encode("utf-8")
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)
        h.update(label.to_bytes(4, "big", signed=True))
    return h.hexdigest()


def draw_key(secret: bytes, table_sha256: str) -> bytes:
    """The key of one draw on one table: HMAC-SHA256(draw secret, table digest)."""
    return hmac.new(secret, b"label draw\0" + table_sha256.encode(), hashlib.sha256).digest()


def id_codes(key: bytes, ids: Sequence[str], rows: NDArray[np.int64]) -> NDArray[np.uint64]:
    """(n,) uint64: the first 8 bytes of HMAC-SHA256(``key``, id) of each of ``rows`` of
    ``ids``, the value every random draw of that id's label is keyed by. Computed for the
    whole id list once per key and list (about 2 s per million ids), then looked up."""
    with _codes_lock:
        cached = _codes.get(key)
        if cached is not None and cached[0] is ids:
            _codes.move_to_end(key)
            return cached[1][rows]
    codes = np.fromiter(
        (
            int.from_bytes(hmac.new(key, i.encode("utf-8"), hashlib.sha256).digest()[:8], "big")
            for i in ids
        ),
        dtype=np.uint64,
        count=len(ids),
    )
    with _codes_lock:
        _codes[key] = (ids, codes)
        while len(_codes) > _CACHED:
            _codes.popitem(last=False)
    return codes[rows]


class TableIdentity:
    """The content digest of party B's label table (``table_digest``), computed on first
    use (a pass over every id: about a second per million) and kept: the table a process
    serves does not change while it runs."""

    def __init__(self, labels: "LabelSource") -> None:
        self._labels = labels
        self._digest: str | None = None
        self._lock = threading.Lock()

    @property
    def digest(self) -> str:
        with self._lock:
            if self._digest is None:
                labels = self._labels
                targets = labels.targets(np.arange(len(labels.ids))).numpy()
                self._digest = table_digest(labels.ids, targets)
            return self._digest


@dataclass(frozen=True)
class RunDraw:
    """The label draw a new run trains on: its row (for the ledger) and its key."""

    row: store.LabelDraw
    key: bytes


def table_draw(
    sessions: sessionmaker[Session], policy: PrivacyPolicy, table: TableIdentity
) -> RunDraw | None:
    """The draw of ``table`` that a run created now under ``policy`` takes its labels from
    (None without label DP): the table's current one for the policy's mechanism, made and
    committed by the first run that needs it, in a transaction of its own."""
    if policy.label_epsilon is None:
        return None
    digest = table.digest
    with sessions() as session:
        row = store.current_draw(
            session,
            table_sha256=digest,
            mechanism=mechanism(policy),
            epsilon=policy.label_epsilon,
            new_secret=lambda: run_secrets.new_secret(),  # looked up now: tests pin it
        )
        return RunDraw(row, draw_key(row.secret, digest))
