"""Checks ``fedlite-b serve`` makes before it starts, so that a mistake is one clear line.

Without them a missing certificate is a 33-line traceback from deep inside uvicorn that does
not name the file, and a key that belongs to another certificate is an OpenSSL error code.
Each :class:`StartupError` names the file, the setting it came from, and the fix.
"""

import ssl
from pathlib import Path

from party_b.errors import StartupError
from party_b.settings import Settings

__all__ = [
    "check_client_cas",
    "check_files",
    "check_label_header",
    "check_tls",
    "check_trusted_proxy",
]

_CERT = "--ssl-certfile / FEDLITE_B_SSL_CERTFILE"
_KEY = "--ssl-keyfile / FEDLITE_B_SSL_KEYFILE"


def check_files(settings: Settings) -> None:
    """The label table (its header too: a wrong column name is told before torch and the
    rows load) and the TLS files exist and are usable."""
    if settings.labels is not None:
        _readable(settings.labels, "label table", "--labels / FEDLITE_B_LABELS")
        check_label_header(settings)
    check_tls(settings.ssl_certfile, settings.ssl_keyfile)
    check_client_cas(settings.ssl_ca_certs, settings.ssl_certfile)
    check_trusted_proxy(settings)
    if settings.tokens_file is not None:
        from party_b.token_file import read_token_file

        _readable(settings.tokens_file, "tokens file", "--tokens-file / FEDLITE_B_TOKENS_FILE")
        try:
            read_token_file(settings.tokens_file)
        except ValueError as exc:
            raise StartupError(str(exc)) from None


def check_trusted_proxy(settings: Settings) -> None:
    """A trusted load balancer is known by its client certificate: mutual TLS is needed, and
    its subject must read as one."""
    subject = settings.trusted_proxy_subject
    if subject is None:
        return
    where = "--trusted-proxy-subject / FEDLITE_B_TRUSTED_PROXY_SUBJECT"
    if settings.ssl_ca_certs is None:
        raise StartupError(
            f"{where} is set, but party B does not ask for client certificates: the load "
            "balancer is known by its certificate; pass --ssl-ca-certs / "
            "FEDLITE_B_SSL_CA_CERTS (the CA that signed it), with --ssl-certfile/--ssl-keyfile"
        )
    from party_b.subjects import normalize_subject

    try:
        normalize_subject(subject)
    except ValueError as exc:
        raise StartupError(f"{where}: {exc}") from None


_CA = "--ssl-ca-certs / FEDLITE_B_SSL_CA_CERTS"


def check_label_header(settings: Settings) -> None:
    """The label table's header names the id, label, client and feature columns."""
    from shared.idtables import TableError, check_columns

    assert settings.labels is not None
    required = {settings.id_column: "id column (--id-column)"}
    required[settings.label_column] = "label column (--label-column)"
    if settings.group_column:
        required[settings.group_column] = "client column (--group-column)"
    for column in settings.feature_columns or ():
        required[column] = "feature column (--feature-columns)"
    try:
        check_columns(settings.labels, required)
    except TableError as exc:
        raise StartupError(f"label table {exc}") from None


def check_client_cas(ca_certs: Path | None, certfile: Path | None) -> None:
    """The CAs of mutual TLS load, and come with a server certificate."""
    if ca_certs is None:
        return
    if certfile is None:
        raise StartupError(f"client certificates ({_CA}) need TLS: set {_CERT} and {_KEY} too")
    _readable(ca_certs, "client CA file", _CA)
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(ca_certs))
    except ssl.SSLError as exc:
        raise StartupError(
            f"client CA file {ca_certs} is not a PEM certificate ({exc.reason}); {_CA} takes "
            "the certificate(s) of the CA that signs party A's client certificates"
        ) from None


def check_tls(certfile: Path | None, keyfile: Path | None) -> None:
    """``certfile`` (PEM chain) and ``keyfile`` (its private key, unencrypted) load together."""
    if certfile is None:
        if keyfile is not None:
            raise StartupError(f"a TLS key ({keyfile}) without a certificate: set {_CERT} too")
        return
    _readable(certfile, "TLS certificate", _CERT)
    if keyfile is not None:
        _readable(keyfile, "TLS key", _KEY)
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(certfile))
    except ssl.SSLError as exc:
        raise StartupError(
            f"TLS certificate {certfile} is not a PEM certificate ({exc.reason}); "
            f"{_CERT} takes the server certificate (and chain) in PEM"
        ) from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    key = keyfile or certfile
    try:
        context.load_cert_chain(str(certfile), str(keyfile) if keyfile else None, _no_password)
    except _Encrypted:
        raise StartupError(
            f"TLS key {key} is encrypted; party B needs it unencrypted in a file only its user "
            f"can read (openssl pkey -in {key} -out party_b.key && chmod 600 party_b.key)"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise StartupError(
                f"TLS key {key} does not match the certificate {certfile}: pass the key made "
                f"with this certificate (compare `openssl x509 -noout -pubkey -in {certfile}` "
                f"with `openssl pkey -pubout -in {key}`)"
            ) from None
        if keyfile is None:
            raise StartupError(
                f"TLS certificate {certfile} holds no private key: set {_KEY} to its key"
            ) from None
        raise StartupError(
            f"TLS key {key} cannot be loaded ({exc.reason or exc}); {_KEY} takes the "
            "certificate's private key in PEM"
        ) from None


class _Encrypted(Exception):
    pass


def _no_password() -> str:
    raise _Encrypted


def _readable(path: Path, what: str, setting: str) -> None:
    if not path.exists():
        raise StartupError(f"{what} {path} does not exist ({setting})")
    if not path.is_file():
        raise StartupError(f"{what} {path} is not a file ({setting})")
    try:
        with path.open("rb"):
            pass
    except PermissionError:
        raise StartupError(
            f"{what} {path} cannot be read by this user; let party B's user read it ({setting})"
        ) from None
