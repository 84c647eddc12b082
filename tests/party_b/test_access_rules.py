"""The rules of ``party_b.access`` and ``party_b.ops.mtls`` without a server: scopes, expiry
texts, certificate subjects as text (the HTTP and TLS behaviour is in
tests/party_b/api/test_token_scopes.py and tests/e2e/test_mutual_tls.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from party_b.access import ALL_SCOPES, SCOPES, Action, authorize, parse_expiry, parse_scopes
from party_b.errors import ProblemError
from party_b.ops.mtls import normalize_subject, subject_text
from party_b.service import Caller

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "after"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("2w", timedelta(weeks=2)),
        (" 3600s ", timedelta(hours=1)),
    ],
)
def test_expiry_durations(text: str, after: timedelta) -> None:
    assert parse_expiry(text, now=NOW) == NOW + after


def test_expiry_dates_are_utc() -> None:
    assert parse_expiry("2027-01-31", now=NOW) == datetime(2027, 1, 31, tzinfo=UTC)
    assert parse_expiry("2027-01-31T12:30:00Z", now=NOW) == datetime(
        2027, 1, 31, 12, 30, tzinfo=UTC
    )
    for bad in ("0d", "tomorrow", "2026-10-01", "-5d"):
        with pytest.raises(ValueError, match="--expires"):
            parse_expiry(bad, now=NOW)


def test_scopes() -> None:
    assert parse_scopes("all") == ALL_SCOPES == frozenset(SCOPES)
    assert parse_scopes("predict, read") == {"predict", "read"}
    with pytest.raises(ValueError, match="unknown scope 'admin'"):
        parse_scopes("train,admin")
    # a predict-only token cannot create runs or steps; a train token can do all of training
    assert Action.CREATE_RUN not in SCOPES["predict"] and Action.STEP not in SCOPES["predict"]
    assert Action.PREDICT not in SCOPES["train"]
    assert SCOPES["read"] <= SCOPES["train"]
    # a scoring partner reads runs, not their step logs or evaluations (label-derived)
    assert SCOPES["predict"] & SCOPES["read"] == {Action.READ}


def test_authorize_names_the_scope_and_what_is_needed() -> None:
    scorer = Caller(token_id=1, name="scorer", scopes=("predict",), actions=SCOPES["predict"])
    authorize(scorer, Action.PREDICT)
    with pytest.raises(ProblemError) as refused:
        authorize(scorer, Action.STEP)
    assert refused.value.status == 403
    assert refused.value.extensions == {"reason": "scope", "scope": ["predict"], "needs": ["train"]}
    authorize(Caller(token_id=1, name="old"), Action.STEP)  # no grant: everything


def test_subjects_read_from_a_certificate_match_openssls_rfc2253_text() -> None:
    # SSLSocket.getpeercert()["subject"]: most general RDN first
    subject = (
        (("countryName", "DE"),),
        (("organizationName", "Bank A, Frankfurt"),),
        (("organizationalUnitName", "ML"), ("userId", "7")),
        (("commonName", " bank-a"),),
    )
    text = subject_text(subject)
    assert text == "CN=\\ bank-a,OU=ML+UID=7,O=Bank A\\, Frankfurt,C=DE"
    assert normalize_subject(text) == text


def test_an_operators_subject_is_normalized() -> None:
    assert normalize_subject(" cn = bank-a ,  o=Bank A, commonName=x") == "CN=bank-a,O=Bank A,CN=x"
    assert normalize_subject("CN=a\\,b,O=c") == "CN=a\\,b,O=c"
    for bad in ("bank-a", "CN=", "=x"):
        with pytest.raises(ValueError, match="NAME=value"):
            normalize_subject(bad)
