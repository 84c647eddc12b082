"""Who a request is and what it may do: scopes, expiry and certificate subjects of API tokens.

A token's *grant* (table ``token_grants``, ``party_b.store.tables.TokenGrant``) says

* ``scopes``: what it may do, a set of the names in :data:`SCOPES` (``train``, ``predict``,
  ``read``); a token without a grant row (every token issued before grants existed, and the
  ones of FEDLITE_B_TOKENS) has them all;
* ``expires_at``: after it, the token is refused (401, ``reason: "expired"``);
* ``subject``: the client certificate the token must come with (mutual TLS, docs/DEPLOY.md):
  the subject as RFC 4514 text, e.g. ``CN=bank-a,O=Bank A,C=DE``; with
  ``certificate_only`` the certificate alone identifies the caller, with no bearer token;
* ``runs_of``: the token whose runs it acts on (a scoring partner's predict-only token sees
  the runs the training token made); by default its own.

A *party token* (``party_b.party_tokens``: one feature party of one run with several,
docs/PROTOCOL.md section 12.2) is identified here too, by the same rules: it acts as its
run's owner, for that run and party only (``Caller.party``), on the party routes alone.

Routes name the :class:`Action` they perform; :func:`authorize` checks it against the
caller's scopes before the run is looked up, so a token outside its scope learns nothing
about which runs exist (403 ``forbidden``, ``reason: "scope"``).
"""

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from api_schemas import ProblemType
from party_b import auth
from party_b.errors import ProblemError
from party_b.party_tokens import PartyScope, authenticate_party
from party_b.store.engine import Database
from party_b.store.grants import certificate_credential, token_credential
from party_b.subjects import forwarded_subject

__all__ = [
    "ALL_SCOPES",
    "FORWARDED_SUBJECT",
    "PARTY_ACTIONS",
    "SCOPES",
    "Action",
    "Caller",
    "Identity",
    "authorize",
    "identify",
    "parse_duration",
    "parse_expiry",
    "parse_scopes",
    "presented_subject",
]


class Action(StrEnum):
    """What a route does, as far as access is concerned."""

    READ = "read"  # GET a run, the runs, PSI info
    # GET a run's step log and evaluations: label-derived metrics, more than a scoring
    # partner needs (docs/DEPLOY.md: a predict token does PSI and scores)
    READ_LOGS = "read-logs"
    CREATE_RUN = "create-run"
    PSI = "psi"  # a private set intersection (training and serving both need one)
    ALIGN = "align"
    STEP = "step"  # a training step, or rolling back to a checkpoint
    FINISH = "finish"
    DELETE = "delete"
    EVALUATE = "evaluate"
    PREDICT = "predict"


# A scope is a named set of actions; a token holds one or more scopes.
SCOPES: dict[str, frozenset[Action]] = {
    "train": frozenset(
        {
            Action.READ,
            Action.READ_LOGS,
            Action.CREATE_RUN,
            Action.PSI,
            Action.ALIGN,
            Action.STEP,
            Action.FINISH,
            Action.DELETE,
            Action.EVALUATE,  # held-out metrics are part of training (`fedlite-a train`)
        }
    ),
    "predict": frozenset({Action.READ, Action.PSI, Action.PREDICT}),
    "read": frozenset({Action.READ, Action.READ_LOGS}),
}
ALL_SCOPES = frozenset(SCOPES)

# What a party token may do, on its own run and as its own party (no run to create or delete).
PARTY_ACTIONS = frozenset(
    {
        Action.READ,
        Action.READ_LOGS,
        Action.PSI,
        Action.ALIGN,
        Action.STEP,
        Action.FINISH,
        Action.EVALUATE,
        Action.PREDICT,
    }
)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from (``identify``): ``token_id`` is the token whose runs it sees
    and acts on, ``name`` the token's name (logs, the audit trail)."""

    token_id: int
    name: str
    subject: str | None = None  # the client certificate's subject, with mutual TLS
    scopes: tuple[str, ...] = ()  # the token's scope names, for messages
    actions: frozenset[str] | None = None  # what it may do; None: anything
    party: PartyScope | None = None  # a party token: the one run and party it acts for


def parse_scopes(text: str) -> frozenset[str]:
    """``"train,predict"`` -> {"train", "predict"}; ``"all"`` is every scope. ValueError for
    a name that is not a scope."""
    names = {s.strip() for s in text.split(",") if s.strip()}
    if not names:
        raise ValueError(f"no scope given; choose from {', '.join([*SCOPES, 'all'])}")
    if "all" in names:
        return ALL_SCOPES
    unknown = sorted(names - set(SCOPES))
    if unknown:
        raise ValueError(
            f"unknown scope {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join([*SCOPES, 'all'])} (comma-separated for several)"
        )
    return frozenset(names)


_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_expiry(text: str, *, now: datetime | None = None) -> datetime:
    """When a token given ``--expires text`` expires: a duration from now (``30d``, ``12h``,
    ``90m``, ``2w``, ``3600s``) or a UTC date or date-time (``2027-01-31``,
    ``2027-01-31T12:00:00Z``). ValueError otherwise, or for a moment not in the future."""
    now = now or datetime.now(UTC)
    duration = parse_duration(text, "--expires")
    if duration is not None:
        if duration <= timedelta(0):
            raise ValueError(f"--expires {text!r}: a duration must be positive")
        try:
            return now + duration
        except OverflowError:
            raise ValueError(
                f"--expires {text!r} is past the year 9999: give a shorter duration or a date"
            ) from None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--expires {text!r}: give a duration (30d, 12h, 90m, 2w) or a UTC date "
            "(2027-01-31 or 2027-01-31T12:00:00Z)"
        ) from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    if moment <= now:
        raise ValueError(f"--expires {text!r} is not in the future")
    return moment


def parse_duration(text: str, flag: str) -> timedelta | None:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` as a timedelta; None for text that is not
    a duration; ValueError naming ``flag`` for one no timedelta holds (``99999999999d``)."""
    match = _DURATION.match(text)
    if not match:
        return None
    try:
        return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])
    except OverflowError:
        raise ValueError(
            f"{flag} {text!r}: a duration of at most 999,999,999 days (about 2.7 million years)"
        ) from None


@dataclass(frozen=True)
class Identity:
    """What a connection presents: a bearer token and/or a verified client certificate's
    subject (RFC 4514 text; None without mutual TLS)."""

    token: str | None
    subject: str | None


@dataclass(frozen=True)
class _Credential:
    """What a presented token or certificate was found to be, before its grant's checks."""

    name: str  # the token's name; a party token: "{party}@{run id}"
    owner_id: int  # whose runs it acts on
    expires_at: datetime | None
    subject: str | None  # the client certificate it must come with
    scopes: tuple[str, ...]
    actions: frozenset[str]
    party: PartyScope | None = None


class _Grant(Protocol):
    """A token's grant as the checks read it: a ``TokenGrant`` row, or the grant columns of
    ``store.token_credential``'s row."""

    @property
    def scopes(self) -> str: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def subject(self) -> str | None: ...
    @property
    def runs_of(self) -> int | None: ...


# the header in which a load balancer that verified the client's certificate names it
FORWARDED_SUBJECT = "x-fedlite-client-subject"


def presented_subject(
    connection: str | None, forwarded: str | None, trusted_proxy: str | None
) -> str | None:
    """The certificate subject a request presents: its connection's own, or, on a connection
    whose certificate is the trusted load balancer's (``--trusted-proxy-subject``), the one
    the balancer forwards in ``FORWARDED_SUBJECT`` (None without it: the balancer's own
    certificate never identifies a caller). A header on any other connection is ignored:
    only a hop party B authenticated can say who is behind it."""
    if trusted_proxy is None or connection is None or connection != trusted_proxy:
        return connection
    if not forwarded or not forwarded.strip():
        return None
    return forwarded_subject(forwarded)


def identify(db: Database, presented: Identity, *, now: datetime | None = None) -> Caller:
    """The caller of a request, or a 401 problem naming why (``reason``: ``token``,
    ``expired``, ``certificate``): the same rules for an API token and a party token.
    ``db``: a session, or a connection (the lookups are Core statements)."""
    now = now or datetime.now(UTC)
    found = _credential(db, presented)
    if found.subject is not None:
        _check_subject(found, presented.subject)
    if found.expires_at is not None and found.expires_at <= now:
        raise _refused(
            "expired",
            f"the token {found.name!r} expired at {found.expires_at:%Y-%m-%dT%H:%M:%SZ}; ask "
            "party B's operator for a new one",
            expired_at=found.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
    return Caller(
        token_id=found.owner_id,
        name=found.name,
        subject=presented.subject,
        scopes=found.scopes,
        actions=found.actions,
        party=found.party,
    )


def _credential(db: Database, presented: Identity) -> _Credential:
    """The bearer token's credential (an API token or a party token), or the certificate's
    alone (a grant ``certificate_only``); 401 for none."""
    if presented.token:
        digest = auth.hash_token(presented.token)
        token = token_credential(db, digest)
        # (the lookup is by the hash of a high-entropy secret; compare_digest keeps the final
        # check constant-time anyway)
        if (
            token is not None
            and token.revoked_at is None
            and hmac.compare_digest(token.token_sha256, digest)
        ):
            return _granted(token.name, token.id, token if token.scopes is not None else None)
        party = authenticate_party(db, presented.token)
        if party is None:
            raise _refused("token", "unknown or revoked token")
        scope = party.scope
        return _Credential(
            name=f"{scope.party}@{scope.run_id}",
            owner_id=party.owner_id,  # a party token acts as its run's owner, for its run
            expires_at=party.expires_at,
            subject=party.subject,
            scopes=("party",),
            actions=PARTY_ACTIONS,
            party=scope,
        )
    if presented.subject is None:
        raise _refused("token", "send 'Authorization: Bearer <token>'")
    grant = certificate_credential(db, presented.subject)  # (of an unrevoked token)
    if grant is None or not grant.certificate_only:
        raise _refused(
            "certificate",
            f"no token given, and the certificate {presented.subject!r} does not identify "
            "a caller on its own: send 'Authorization: Bearer <token>'",
        )
    return _granted(grant.name, grant.id, grant)


def _granted(name: str, token_id: int, grant: _Grant | None) -> _Credential:
    """The credential of the API token ``name`` (id ``token_id``) under its grant (None:
    every scope, no expiry, no certificate)."""
    scopes = _scopes(grant)
    return _Credential(
        name=name,
        owner_id=grant.runs_of if grant is not None and grant.runs_of is not None else token_id,
        expires_at=grant.expires_at if grant is not None else None,
        subject=grant.subject if grant is not None else None,
        scopes=tuple(sorted(scopes)),
        actions=frozenset().union(*(SCOPES[s] for s in scopes)),
    )


def authorize(caller: Caller, action: Action) -> None:
    """403 ``forbidden`` unless the caller's scopes allow ``action``."""
    if caller.actions is None or action in caller.actions:
        return
    needs = sorted(name for name, actions in SCOPES.items() if action in actions)
    raise ProblemError(
        ProblemType.FORBIDDEN,
        f"the token {caller.name!r} has scope {','.join(caller.scopes)}; {action.value} needs "
        f"scope {' or '.join(needs)}",
        reason="scope",
        scope=list(caller.scopes),
        needs=needs,
    )


def _scopes(grant: _Grant | None) -> Iterable[str]:
    if grant is None:
        return ALL_SCOPES
    return [s for s in grant.scopes.split(",") if s in SCOPES]


def _check_subject(found: _Credential, subject: str | None) -> None:
    assert found.subject is not None
    if subject is None:
        raise _refused(
            "certificate",
            f"the token {found.name!r} is bound to the client certificate {found.subject!r}; "
            "connect with it (party B must run with mutual TLS, --ssl-ca-certs)",
        )
    if not hmac.compare_digest(subject.encode(), found.subject.encode()):
        raise _refused(
            "certificate",
            f"the token {found.name!r} is bound to the client certificate {found.subject!r}, "
            f"not to {subject!r}",
        )


def _refused(reason: str, detail: str, **extensions: str) -> ProblemError:
    return ProblemError(ProblemType.UNAUTHORIZED, detail, reason=reason, **extensions)
