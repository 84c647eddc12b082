"""Sample alignment behind one interface: which of party A's ids does party B also hold?

Two steps, neither of which shows either party an id of the other's outside the intersection:

1. Private set intersection (``shared.psi``: ECDH-PSI over P-256). Party A sends its ids
   blinded under its secret key; party B answers with its own ids blinded under its key and
   party A's re-blinded. Party A learns the intersection; party B learns only how many ids
   party A offered. Party B's key and blinded set are kept per *dataset version* (a content
   hash of its id list, never sent), so one set-up serves every request until the label
   table changes.
2. Run alignment. Party A sends HMAC(run key, id) for the ids of the intersection only;
   party B keeps those it holds (all of them, for an honest party A) and the run trains on
   them. The *aligned key* of a sample is this HMAC: batch digests are computed over it.

Both parties order the intersection by the *raw* id, which each of them knows for the samples
they share: the order (and with it every batch) then depends only on the data and the seed,
not on the random per-run key, so two runs with the same seed train identically.
"""

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from shared.psi import PsiReply, PsiServer, dataset_digest

__all__ = ["Aligner", "PsiAligner"]

log = logging.getLogger("fedlite.party_b")

# (content digest of the id list) -> (public dataset version, secret PSI key), from the store
KeyLookup = Callable[[str], tuple[str, bytes]]


class Aligner(Protocol):
    def dataset_version(self) -> str:
        """Public name of party B's current id set; changes when the set changes."""
        ...

    def psi(self, request: bytes, *, max_ids: int) -> tuple[PsiReply, int]:
        """Answer one PSI request: the reply and how many ids it held.

        Raises ``shared.psi.PsiError`` for a bad request.
        """
        ...

    def intersect(self, own_keys: set[bytes], offered: list[bytes]) -> set[bytes]:
        """Aligned keys both parties hold (each party orders them by its raw ids)."""
        ...


class PsiAligner:
    """ECDH-PSI over party B's ids; the blinded set is built on first use and then kept."""

    def __init__(self, ids: Sequence[str], keys: KeyLookup) -> None:
        self._ids = ids
        self._keys = keys
        self._lock = threading.Lock()
        self._version: str | None = None
        self._server: PsiServer | None = None

    def dataset_version(self) -> str:
        with self._lock:
            if self._version is None:
                self._version, _key = self._keys(dataset_digest(self._ids))
            return self._version

    def psi(self, request: bytes, *, max_ids: int) -> tuple[PsiReply, int]:
        server, version = self._server_and_version()
        response, count = server.respond(request, max_ids=max_ids)
        return PsiReply(dataset_version=version, setup=server.setup, response=response), count

    def intersect(self, own_keys: set[bytes], offered: list[bytes]) -> set[bytes]:
        return own_keys.intersection(offered)

    def _server_and_version(self) -> tuple[PsiServer, str]:
        with self._lock:  # one thread builds the set-up; the others wait for it
            if self._server is None or self._version is None:
                self._version, key = self._keys(dataset_digest(self._ids))
                log.info("building the PSI set-up of %d ids (once per dataset)", len(self._ids))
                self._server = PsiServer(self._ids, key)
            return self._server, self._version
