"""Mutual TLS for ``fedlite-b serve``: client certificates required, and their subjects handed
to the app.

With ``--ssl-ca-certs CA.pem`` party B asks every connection for a client certificate and
accepts only one that CA signed (``ssl.CERT_REQUIRED``: the handshake fails otherwise, before
any HTTP). uvicorn does not pass the peer's certificate to the app, so :func:`tls_protocol`
wraps its HTTP protocol: each connection's app sees the ASGI TLS extension
(``scope["extensions"]["tls"]``, https://asgi.readthedocs.io/en/latest/specs/tls.html) with
``client_cert_name``, the verified subject as RFC 4514 text, which is what a token can be bound
to (``party_b.access``). Any ASGI server that implements the extension (Hypercorn does) works
with the app unchanged.

Subjects are compared as text in one normal form: :func:`subject_text` (from the certificate)
and :func:`normalize_subject` (from the operator) both give what
``openssl x509 -noout -subject -nameopt RFC2253`` prints, e.g. ``CN=bank-a,O=Bank A,C=DE``.
"""

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["normalize_subject", "subject_text", "tls_extension", "tls_protocol"]

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

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


def tls_extension(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The ASGI TLS extension of one connection; None for plain HTTP."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    peer = ssl_object.getpeercert()
    der = ssl_object.getpeercert(binary_form=True)
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": subject_text(peer["subject"]) if peer else None,
        "client_cert_error": None,  # CERT_REQUIRED: an unverified one never gets this far
        "tls_version": None,
        "cipher_suite": None,
    }


def tls_protocol(base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class ``base``, filling in the TLS extension of every request
    of a connection (pass the result as ``uvicorn.run(http=...)``)."""

    class WithTls(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            info = tls_extension(transport)
            if info is not None:
                # uvicorn's protocols call self.app for every request of the connection
                app: ASGIApp = getattr(self, "app")  # noqa: B009 - untyped in the base
                setattr(self, "app", _with_tls(app, info))  # noqa: B010

    WithTls.__name__ = f"{base.__name__}WithTls"
    return WithTls


def _with_tls(app: ASGIApp, info: dict[str, Any]) -> ASGIApp:
    async def with_tls(scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") in ("http", "websocket"):
            scope = {**scope, "extensions": {**(scope.get("extensions") or {}), "tls": info}}
        await app(scope, receive, send)

    return with_tls
