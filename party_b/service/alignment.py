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

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from sqlalchemy.orm import Session

from api_schemas import AlignmentOut, PsiInfo, RunCreate, RunStatus
from party_b import audit, store
from party_b.errors import ProblemError
from party_b.service.context import ServiceContext
from party_b.service.declared import limit_problem
from party_b.service.fusion import PartyPlan
from party_b.service.meetings import Agenda, Ticket, at_once
from party_b.service.runstate import Caller, owned_row, party_of
from party_b.service.views import alignment_out
from shared import codec
from shared.alignkeys import (
    AlignReply,
    AmbiguousPrefix,
    decode_align_request,
    encode_align_reply,
    kept_bitmap,
    match_prefixes,
)
from shared.alignment import hmac_ids, order_by_raw_id
from shared.psi import (
    PSI_PROTOCOL,
    PsiError,
    PsiReply,
    PsiServer,
    PsiTooLarge,
    dataset_digest,
    decode_psi_request,
    encode_psi_reply,
    new_server_key,
)
from shared.schedule import split_train_eval

__all__ = ["Aligner", "Alignment", "PsiAligner"]

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

    def warm_up(self) -> None:
        """Build the set-up now rather than on the first PSI request."""
        self._server_and_version()

    def _server_and_version(self) -> tuple[PsiServer, str]:
        with self._lock:  # one thread builds the set-up; the others wait for it
            if self._server is None or self._version is None:
                self._version, key = self._keys(dataset_digest(self._ids))
                log.info("building the PSI set-up of %d ids (once per dataset)", len(self._ids))
                started = time.perf_counter()
                self._server = PsiServer(self._ids, key)
                log.info("PSI set-up ready (%.1f s)", time.perf_counter() - started)
            return self._server, self._version


class Alignment:
    """The alignment room: PSI with party A, then aligning a run on the intersection."""

    def __init__(self, ctx: ServiceContext, aligner: Aligner | None = None) -> None:
        self._ctx = ctx
        self._aligner = aligner or PsiAligner(ctx.labels.ids, self._psi_key)

    def warm_up(self) -> None:
        """Build party B's PSI set-up (its blinded ids: seconds per 10,000 ids) before any
        party A asks; ``fedlite-b serve`` calls it in a background thread at start-up."""
        warm = getattr(self._aligner, "warm_up", None)
        if warm is not None:
            warm()

    def psi_info(self, caller: Caller) -> PsiInfo:
        """What party A needs before a PSI: party B's dataset version (to look up its cache).
        A feature party of a run with several aligns through its JSON route only."""
        return PsiInfo(
            dataset_version=self._aligner.dataset_version(),
            protocol=PSI_PROTOCOL,
            size=len(self._ctx.labels.ids),
            max_ids=self._ctx.limits.max_aligned_ids,
            alignment_formats=["json"] if caller.party is not None else ["json", "keys"],
            max_batch=self._ctx.limits.max_batch,
            max_body_bytes=self._ctx.limits.max_body_bytes,
        )

    def psi(self, caller: Caller, body: bytes) -> bytes:
        """One private set intersection request (shared.psi); returns the encoded PsiReply."""
        try:
            request = decode_psi_request(body, limits=self._ctx.decode_limits)
            reply, count = self._aligner.psi(
                request.request, max_ids=self._ctx.limits.max_aligned_ids
            )
        except PsiTooLarge as exc:
            found = str(exc).partition(", over")[0]  # "N ids in the request"
            bound = self._ctx.limits.max_aligned_ids
            raise limit_problem(f"PSI: {found}", "max_aligned_ids", bound) from None
        except (PsiError, codec.CodecError) as exc:
            raise ProblemError.malformed(str(exc)) from None
        # Every PSI answers "which of these ids do you hold?": keep a record of who asked.
        log.info("PSI request from %s: %d ids offered", caller.name, count)
        audit.record(self._ctx.sessions, caller, "psi", None, ids=count)
        data = encode_psi_reply(reply)
        self._ctx.metrics.bytes_received.labels("psi").inc(len(body))
        self._ctx.metrics.bytes_sent.labels("psi").inc(len(data))
        return data

    def align(
        self, caller: Caller, run_id: str, hashed_hex: Sequence[str]
    ) -> AlignmentOut | Ticket:
        """A party's aligned keys: HMAC(run key, id) of the ids in its private set
        intersection with party B (``psi``), none other. The run is aligned on the keys every
        party sent that party B holds with a label (at once for a run with one feature
        party, else once every party's keys are in) and started; idempotent."""
        self._within_limit(len(hashed_hex))
        offered = {bytes.fromhex(h) for h in hashed_hex}
        return self._offer(caller, run_id, lambda own: own & offered)

    def align_keys(self, caller: Caller, run_id: str, body: bytes) -> bytes:
        """``align`` in binary (shared.alignkeys), for a run with one feature party: key
        prefixes in, a bitmap of the kept ones out; the encoded ``AlignReply``."""
        with self._ctx.sessions() as session:
            owned_row(session, caller, run_id)  # 404 before the body is read
        try:
            request = decode_align_request(body, limits=self._ctx.decode_limits)
        except codec.CodecError as exc:
            raise ProblemError.malformed(str(exc)) from None
        self._within_limit(request.n)
        matched: list[bytes | None] = []

        def common(own: set[bytes]) -> set[bytes]:
            try:
                matched.extend(match_prefixes(list(own), request))
            except AmbiguousPrefix as exc:
                raise ProblemError.invalid(str(exc)) from None
            return own.intersection(m for m in matched if m is not None)

        out = self._offer(caller, run_id, common)
        assert isinstance(out, AlignmentOut), "one party: aligned at once"
        aligned = {bytes.fromhex(h) for h in out.intersection}
        reply = AlignReply(
            n=request.n, kept=kept_bitmap(matched, aligned), train=out.train, eval=out.eval
        )
        data = encode_align_reply(reply)
        self._ctx.metrics.bytes_received.labels("alignment").inc(len(body))
        self._ctx.metrics.bytes_sent.labels("alignment").inc(len(data))
        return data

    def _within_limit(self, ids: int) -> None:
        bound = self._ctx.limits.max_aligned_ids
        if ids > bound:
            raise limit_problem(f"{ids:,} ids to align", "max_aligned_ids", bound)

    def _offer(
        self, caller: Caller, run_id: str, keep: Callable[[set[bytes]], set[bytes]]
    ) -> AlignmentOut | Ticket:
        """The caller's part of the run's alignment: ``keep(party B's trainable keys)``. A run
        aligned already answers a party whose keys are the ones it aligned with (a retry):
        with one party exactly, with several a superset of the common ones."""
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            plan = PartyPlan.of(RunCreate.from_stored(run.config))
            index = party_of(plan, run_id, caller)
            mine = frozenset(keep(self._trainable(run)))
            if run.status != RunStatus.CREATED.value:
                aligned = _aligned_keys(run)
                retry = set(aligned) == mine if len(plan.names) == 1 else set(aligned) <= mine
                if retry:
                    return alignment_out(run, aligned)
                raise ProblemError.run_state("run is already aligned with a different id set")
        agenda = Agenda(
            "the alignment",
            plan.names,
            partial(self._align, caller, run_id),
            wait=self._ctx.wait_of(plan),
        )
        digest = hashlib.sha256(b"".join(sorted(mine))).digest()
        return at_once(
            Ticket(("align",), plan.names[index], (caller, mine), digest, agenda), AlignmentOut
        )

    def _trainable(self, run: store.Run) -> set[bytes]:
        """Aligned keys of the ids party B holds with a label (rows without one are only
        ever served, never trained or evaluated on)."""
        own = hmac_ids(bytes.fromhex(run.alignment_key), self._ctx.labels.ids)
        labeled = self._ctx.labels.labeled
        if labeled is None:
            return set(own)
        return {k for k, ok in zip(own, labeled, strict=True) if ok}

    def _align(
        self, caller: Caller, run_id: str, parts: dict[str, tuple[Caller, frozenset[bytes]]]
    ) -> dict[str, AlignmentOut]:
        """The run aligned on the keys every party holds, ordered by party B's raw ids, and
        started; every party's answer (and its audit row)."""
        with self._ctx.sessions() as session:
            run = owned_row(session, caller, run_id)
            if run.status == RunStatus.CREATED.value:
                common = frozenset.intersection(*(keys for _c, keys in parts.values()))
                own = hmac_ids(bytes.fromhex(run.alignment_key), self._ctx.labels.ids)
                self.start(session, run, order_by_raw_id(self._ctx.labels.ids, own, set(common)))
                session.commit()
            out = alignment_out(run, _aligned_keys(run))
        for party_caller, _keys in parts.values():
            audit.record(
                self._ctx.sessions, party_caller, "align", run_id, ids=len(out.intersection)
            )
        return dict.fromkeys(parts, out)

    def start(self, session: Session, run: store.Run, aligned: list[bytes]) -> None:
        """Split the aligned ids, store them and the initial model: the run is training."""
        spec = RunCreate.from_stored(run.config)
        train_pos, eval_pos = split_train_eval(
            max(len(aligned), 1),
            seed=spec.seed,
            eval_fraction=spec.eval_fraction,
            version=spec.schedule_version,
        )
        # Two rules, named apart (one message for both once read "only 1 ... need at least
        # batch_size=1"): at least 2 ids in common, and a full batch of training samples.
        if len(aligned) < 2:
            raise ProblemError.invalid(
                f"{len(aligned)} id(s) in common; a run needs at least 2 aligned ids"
            )
        if len(train_pos) < spec.batch_size:
            raise ProblemError.invalid(
                f"{len(aligned)} ids in common leave {len(train_pos)} training samples "
                f"(eval_fraction={spec.eval_fraction}), fewer than batch_size={spec.batch_size}"
            )
        model_state, optimizer_state = self._ctx.admission.new_trainer(spec).state()
        run.aligned_ids = b"".join(aligned)
        run.train_size, run.eval_size = len(train_pos), len(eval_pos)
        run.status = RunStatus.TRAINING.value
        store.save_checkpoint(
            session,
            run_id=run.id,
            step=0,
            model_state=model_state,
            optimizer_state=optimizer_state,
            request_sha256=None,
            response=None,
            keep=self._ctx.checkpoints_kept,
        )

    def _psi_key(self, ids_sha256: str) -> tuple[str, bytes]:
        with self._ctx.sessions() as session:
            row = store.psi_key(session, ids_sha256=ids_sha256, new_key=new_server_key)
            return row.dataset_version, row.private_key


def _aligned_keys(run: store.Run) -> list[bytes]:
    blob = run.aligned_ids or b""
    return [blob[i : i + 32] for i in range(0, len(blob), 32)]
