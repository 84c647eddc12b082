"""Certificate subjects (``party_b.subjects``) and who a request presents
(``party_b.access.presented_subject``):

* a load balancer's forwarded subject counts only on the connection of the balancer named by
  ``--trusted-proxy-subject``; on any other connection the header is ignored, and the
  balancer's own certificate never identifies a caller;
* what HAProxy forwards (OpenSSL's RFC 2253 text, bytes above ASCII escaped) reads as the
  subject Python's ``getpeercert`` gives for the same certificate (``subject_text``);
* an operator's ``--subject`` written from the most general attribute to the most specific
  (``openssl x509 -subject``'s default order) is refused with the order that would match
  (``fedlite-b token issue``, exit 2), never stored to be compared in vain.
"""

from pathlib import Path

import pytest

from party_b.access import presented_subject
from party_b.subjects import forwarded_subject, operator_subject, subject_text
from tests.utils.cli import run_cli

PROXY = "CN=fedlite-lb,O=Bank B"


@pytest.mark.parametrize(
    ("connection", "forwarded", "trusted", "presented"),
    [
        ("CN=bank-a,O=Bank A", None, None, "CN=bank-a,O=Bank A"),  # direct mutual TLS
        ("CN=bank-a,O=Bank A", "CN=evil", None, "CN=bank-a,O=Bank A"),  # no proxy trusted
        ("CN=bank-a,O=Bank A", "CN=evil", PROXY, "CN=bank-a,O=Bank A"),  # not the proxy
        (None, "CN=evil", PROXY, None),  # plain connection: the header is nothing
        (PROXY, "CN=bank-a,O=Bank A", PROXY, "CN=bank-a,O=Bank A"),  # the proxy says who
        (PROXY, None, PROXY, None),  # the proxy's own certificate is nobody's
        (PROXY, "  ", PROXY, None),
    ],
)
def test_only_the_trusted_balancer_names_the_callers_certificate(
    connection: str | None, forwarded: str | None, trusted: str | None, presented: str | None
) -> None:
    assert presented_subject(connection, forwarded, trusted) == presented


def test_haproxys_rfc2253_text_reads_as_pythons_subject() -> None:
    # Prepare: the subject of a certificate for /C=DE/O=Bank, A/CN=été as getpeercert has it
    peer = ((("countryName", "DE"),), (("organizationName", "Bank, A"),), (("commonName", "été"),))

    # Execute: what HAProxy's ssl_c_s_dn(,0,rfc2253) sends for it
    forwarded = forwarded_subject(r"CN=\C3\A9t\C3\A9,O=Bank\, A,C=DE")

    # Assert
    assert forwarded == subject_text(peer) == "CN=été,O=Bank\\, A,C=DE"


def test_a_subject_in_the_general_to_specific_order_is_refused_naming_the_other() -> None:
    with pytest.raises(ValueError, match="'CN=bank-a,O=Bank A'"):
        operator_subject("O = Bank A, CN = bank-a")
    assert operator_subject("cn=bank-a, o=Bank A") == "CN=bank-a,O=Bank A"
    assert operator_subject("emailAddress=a@b,CN=bank-a,O=Bank A") == (
        "emailAddress=a@b,CN=bank-a,O=Bank A"
    )


def test_token_issue_refuses_a_subject_no_certificate_would_match(tmp_path: Path) -> None:
    ran = run_cli(
        "b", "token", "issue", "--name", "bank-a", "--data-dir", str(tmp_path / "b"),
        "--subject", "O=Bank A,CN=bank-a",
    )  # fmt: skip

    assert ran.returncode == 2, ran.stderr
    assert "most specific first: 'CN=bank-a,O=Bank A'" in ran.stderr
    assert ran.stdout == ""
