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

Subjects are compared as text in one normal form (``party_b.subjects``, re-exported here):
``subject_text`` (from the certificate) and ``normalize_subject`` (from the operator) both
give what ``openssl x509 -noout -subject -nameopt RFC2253`` prints, e.g.
``CN=bank-a,O=Bank A,C=DE``.
"""

import asyncio
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from party_b.subjects import normalize_subject, subject_text

__all__ = ["normalize_subject", "subject_text", "tls_extension", "tls_protocol"]

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


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
