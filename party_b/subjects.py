"""Certificate subjects as text, in one normal form: what
``openssl x509 -noout -subject -nameopt RFC2253`` prints, e.g. ``CN=bank-a,O=Bank A,C=DE``
(RFC 4514: the most specific attribute first).

Three sources meet here and are compared as text: a verified certificate's subject
(``subject_text``, from ``SSLSocket.getpeercert()``), an operator's ``--subject``
(``operator_subject``: normalized, and refused in an order no certificate's subject is
written in), and the subject a trusted load balancer forwards (``forwarded_subject``:
OpenSSL's RFC 2253 text, whose bytes above ASCII come escaped). No web, database or party
import: ``party_b.access`` (on every request) and the operator's commands both use it.
"""

import re

__all__ = ["forwarded_subject", "normalize_subject", "operator_subject", "subject_text"]

# OpenSSL's short names, as its RFC 2253 output uses them; others keep Python's long name
_SHORT = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIAL = set(',+"\\<>;=')


def _escape(value: str) -> str:
    out = "".join(f"\\{c}" if c in _SPECIAL else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_text(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """``SSLSocket.getpeercert()["subject"]`` as RFC 4514 text (most specific RDN first)."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


_LONG = {short.lower(): short for short in _SHORT.values()} | {
    long.lower(): short for long, short in _SHORT.items()
}


def normalize_subject(text: str) -> str:
    """An operator's subject in the form :func:`subject_text` gives: spaces around ``,``,
    ``+`` and ``=`` dropped, attribute names as OpenSSL's short names (``cn`` -> ``CN``,
    ``commonName`` -> ``CN``). ValueError for text that is not ``NAME=value,...``."""
    rdns = []
    for rdn in _split(text.strip(), ","):
        parts = []
        for pair in _split(rdn, "+"):
            name, sep, value = pair.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not name or not value:
                raise ValueError(
                    f"subject {text!r}: expected NAME=value pairs separated by commas, "
                    "e.g. 'CN=bank-a,O=Bank A' (`openssl x509 -noout -subject -nameopt "
                    "RFC2253 -in client.pem` prints it)"
                )
            parts.append(f"{_LONG.get(name.lower(), name)}={value}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def _split(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` where it is not escaped with a backslash."""
    return [p for p in re.split(rf"(?<!\\){re.escape(sep)}", text) if p.strip()]


# How general an attribute is: a certificate's subject names them from the most general
# (country) to the most specific (common name), and its RFC 4514 text the other way round.
_RANK = {"CN": 0, "UID": 0, "OU": 1, "O": 2, "L": 3, "ST": 4, "C": 5}


def operator_subject(text: str) -> str:
    """An operator's ``--subject``, normalized; ValueError for text that is not a subject, and
    for one written from the most general attribute to the most specific (``O=Bank A,
    CN=bank-a``: the order ``openssl x509 -subject`` prints without ``-nameopt RFC2253``),
    which no certificate's RFC 4514 subject would ever equal, naming the order that would."""
    normal = normalize_subject(text)
    rdns = _split(normal, ",")
    ranks = [_RANK[name] for rdn in rdns if (name := rdn.partition("=")[0]) in _RANK]
    if len(set(ranks)) > 1 and ranks == sorted(ranks, reverse=True):
        reversed_text = ",".join(reversed(rdns))
        raise ValueError(
            f"subject {text!r} lists its attributes from the most general to the most "
            "specific, the order `openssl x509 -subject` prints by default; party B compares "
            f"the RFC 4514 form, most specific first: {reversed_text!r} (`openssl x509 -noout "
            "-subject -nameopt RFC2253 -in client.crt` prints it)"
        )
    return normal


def forwarded_subject(text: str) -> str:
    """A load balancer's RFC 2253 text of a verified certificate (HAProxy's
    ``ssl_c_s_dn(,0,rfc2253)``, OpenSSL's form: bytes above ASCII escaped as ``\\XX``) in the
    form ``subject_text`` gives for the same certificate."""
    out = bytearray()
    for match in re.finditer(r"\\([0-9A-Fa-f]{2})|\\(.)|([^\\])", text, re.S):
        hexpair, escaped, plain = match.groups()
        if hexpair is not None:
            byte = int(hexpair, 16)
            out += (b"\\" + bytes([byte])) if chr(byte) in _SPECIAL else bytes([byte])
        elif escaped is not None:
            out += ("\\" + escaped).encode()
        else:
            out += plain.encode()
    return normalize_subject(out.decode("utf-8", errors="replace"))
