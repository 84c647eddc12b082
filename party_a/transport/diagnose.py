"""Telling a configuration mistake from a network fault, and saying how to fix it.

Party A retries what time can heal (party B restarting, a dropped connection, a 503) and
stops at once at what it cannot: a URL without a scheme, plain HTTP sent to party B's TLS
port, TLS sent to a plain HTTP port, a certificate that fails verification, or a party B
with mutual TLS that refuses party A's client certificate (or its absence). Each of those
gets a message that names the fix; the hints are kept apart by what OpenSSL reports (an
unknown CA and a host-name mismatch need different fixes).

A party B that refuses a client certificate closes the connection without a TLS alert
(Python's asyncio TLS server sends none), which httpx reports as "Server disconnected": a
probe then asks ``GET /healthz`` over a fresh TLS connection with the same certificate. A
party B that answers nothing there, though it speaks TLS, refuses the certificate.
"""

import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx

from party_a.errors import ConfigError

__all__ = [
    "TlsProbe",
    "check_base_url",
    "configuration_fault",
    "refuses_client",
    "speaks_tls",
]

E = TypeVar("E", bound=BaseException)

# OpenSSL's X509_V_ERR_* codes (ssl.SSLCertVerificationError.verify_code)
_UNKNOWN_ISSUER = {
    2,  # unable to get issuer certificate
    18,  # self-signed certificate
    19,  # self-signed certificate in certificate chain
    20,  # unable to get local issuer certificate
    21,  # unable to verify the first certificate
}
_EXPIRED, _NOT_YET_VALID = 10, 9
_NAME_MISMATCH = {62, 64}  # host name mismatch, IP address mismatch
# ssl.SSLError reasons of a TLS client that reached a server speaking something else
_NOT_TLS = {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}


def check_base_url(url: str) -> str:
    """Party B's base URL without a trailing slash; ConfigError for one that cannot work.

    ``partyb.example.org:8443`` (no scheme) would otherwise reach httpx as a URL of scheme
    ``partyb.example.org`` and fail on every retry.
    """
    text = url.strip()
    if "://" not in text:
        raise ConfigError(
            f"party B's URL {url!r} has no scheme: write https://{text} "
            "(or http:// if party B serves without TLS)"
        )
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(f"party B's URL {url!r}: the scheme must be https:// or http://")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ConfigError(f"party B's URL {url!r} has an invalid port") from None
    if not parts.hostname:
        raise ConfigError(f"party B's URL {url!r} has no host name")
    if parts.query or parts.fragment:
        raise ConfigError(f"party B's URL {url!r}: give only scheme, host, port (and a path)")
    return text.rstrip("/")


def speaks_tls(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (certificate not checked: this only
    asks which protocol the port speaks)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def refuses_client(
    host: str, port: int, client_cert: Path | None, client_key: Path | None, timeout: float = 3.0
) -> bool:
    """Whether a TLS server on ``host:port`` closes the connection on ``GET /healthz`` sent
    with this client certificate (or none): it requires one it accepts (mutual TLS)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        if client_cert is not None:
            context.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host) as tls,
        ):
            tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            return tls.recv(16) == b""
    except ssl.SSLError as exc:
        return exc.reason not in _NOT_TLS  # closed in the handshake (TLS 1.2)
    except OSError:
        return False


class TlsProbe:
    """Whether party B's port speaks TLS, asked at most once per client, and only until an
    HTTP answer has come from it.

    Plain HTTP sent to a TLS port fails on every request, so once any request got an HTTP
    answer the question is settled: a reset or a half answer after that is the network.
    Asking on every such fault cost a TLS handshake per retry against a peer that may never
    answer one (a proxy or middlebox waiting for an HTTP request: ``timeout`` s each); with
    K steps in flight on a flaky network that added minutes (issue 17). Thread-safe: the
    K sender threads share one.
    """

    def __init__(self, probe: Callable[[str, int], bool] = speaks_tls) -> None:
        self._probe = probe
        self._settled = False
        self._lock = threading.Lock()
        self.probes = 0  # handshakes tried (at most 1)

    def heard_http(self) -> None:
        """An HTTP answer came back: the port speaks plain HTTP (or TLS, as the URL says)."""
        self._settled = True

    def __call__(self, host: str, port: int) -> bool:
        return self.ask(lambda: self._probe(host, port))

    def ask(self, probe: Callable[[], bool]) -> bool:
        """``probe()``, the first time only and only before any HTTP answer; else False."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            self.probes += 1
            return probe()


def configuration_fault(
    exc: httpx.TransportError,
    base_url: httpx.URL,
    ca_bundle: Path | None,
    probe: Callable[[str, int], bool] = speaks_tls,
    *,
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> str | None:
    """What is misconfigured, with the fix, when ``exc`` cannot heal by retrying; else None.

    ``probe(host, port)``: whether the port speaks TLS, asked when plain HTTP got a reset or
    a garbled answer (a :class:`TlsProbe` asks at most once per client). Over HTTPS such a
    fault asks instead whether party B refuses the client certificate (the same probe
    object, so again at most once)."""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return f"{exc}; party B's URL must start with https:// or http://"
    verify = _find(exc, ssl.SSLCertVerificationError)
    if verify is not None:
        return _certificate_hint(verify, base_url, ca_bundle)
    tls = _find(exc, ssl.SSLError)
    if tls is not None and getattr(tls, "reason", None) in _NOT_TLS:
        return (
            f"{base_url.host}:{_port(base_url)} does not speak TLS ({tls.reason}): if party B "
            f"serves plain HTTP there, use http://{base_url.host}:{_port(base_url)}; otherwise "
            "check the port"
        )
    if (
        base_url.scheme == "http"
        and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
        and probe(base_url.host, _port(base_url))
    ):
        return (
            f"party B serves HTTPS on {base_url.host}:{_port(base_url)}, but the URL says "
            f"http://: use https://{base_url.host}:{_port(base_url)} (with --ca-bundle if its "
            "CA is a private one)"
        )
    if (
        base_url.scheme == "https"
        and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
        and _asks(
            probe, lambda: refuses_client(base_url.host, _port(base_url), client_cert, client_key)
        )
    ):
        where = f"{base_url.host}:{_port(base_url)}"
        if client_cert is None:
            return (
                f"party B at {where} closes every connection without a client certificate: "
                "it requires mutual TLS. Pass party A's certificate and key with "
                "--client-cert / --client-key (or FEDLITE_A_CLIENT_CERT / FEDLITE_A_CLIENT_KEY)"
            )
        return (
            f"party B at {where} refuses the client certificate {client_cert}: it must be "
            "signed by a CA party B trusts (its --ssl-ca-certs), be valid now and allow client "
            "authentication (extendedKeyUsage clientAuth); check with party B's operator"
        )
    return None


def _asks(probe: Callable[[str, int], bool], question: Callable[[], bool]) -> bool:
    """``question()`` through a :class:`TlsProbe` (once per client), or directly."""
    if isinstance(probe, TlsProbe):
        return probe.ask(question)
    return question()


def _certificate_hint(
    error: ssl.SSLCertVerificationError, base_url: httpx.URL, ca_bundle: Path | None
) -> str:
    code = error.verify_code
    what = f"party B's TLS certificate was refused ({error.verify_message})"
    if code in _NAME_MISMATCH:
        return (
            f"{what}: it is not issued for {base_url.host!r}. Connect with the host name the "
            "certificate names (its subjectAltName; see `openssl s_client -connect "
            f"{base_url.host}:{_port(base_url)} </dev/null | openssl x509 -noout -ext "
            "subjectAltName`), or ask party B's operator for a certificate that names "
            f"{base_url.host!r}"
        )
    if code in _UNKNOWN_ISSUER:
        if ca_bundle is not None:
            return (
                f"{what}: it is not signed by a CA in {ca_bundle}; pass the certificate of "
                "the CA that signed it with --ca-bundle (or FEDLITE_A_CA_BUNDLE)"
            )
        return (
            f"{what}: it is signed by a CA this machine does not trust; pass that CA's "
            "certificate (from party B's operator) with --ca-bundle (or FEDLITE_A_CA_BUNDLE)"
        )
    if code in (_EXPIRED, _NOT_YET_VALID):
        return f"{what}; party B's operator must renew it (or check this machine's clock)"
    return f"{what}; check the certificate with party B's operator"


def _find(exc: BaseException, kind: type[E]) -> E | None:
    """The first exception of ``kind`` in the chain httpx -> httpcore -> ssl, or None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)
