"""Party A's TLS settings for party B: which CAs to trust, and the client certificate to
present when party B requires one (mutual TLS, docs/DEPLOY.md section 2).

Every file mistake is a :class:`party_a.errors.ConfigError` naming the file, the flag and the
fix, before any request: a missing file, a key that belongs to another certificate, an
encrypted key (party A never prompts for a password).
"""

import ssl
from pathlib import Path

from party_a.errors import ConfigError

__all__ = ["tls_context"]


def tls_context(
    ca_bundle: Path | None, client_cert: Path | None = None, client_key: Path | None = None
) -> ssl.SSLContext | bool:
    """httpx's ``verify``: True (the CAs httpx trusts by default) or an SSLContext that trusts
    ``ca_bundle`` only and presents ``client_cert`` (PEM; its key in ``client_key`` or in the
    same file)."""
    if client_cert is None:
        if client_key is not None:
            raise ConfigError(
                f"a client key ({client_key}) without a certificate: pass --client-cert too"
            )
        if ca_bundle is None:
            return True
    context = _trusting(ca_bundle)
    if client_cert is not None:
        _present(context, client_cert, client_key)
    return context


def _trusting(ca_bundle: Path | None) -> ssl.SSLContext:
    if ca_bundle is None:
        import certifi  # httpx's own default CAs, so that adding a certificate changes nothing else

        return ssl.create_default_context(cafile=certifi.where())
    try:
        return ssl.create_default_context(cafile=str(ca_bundle))
    except FileNotFoundError:
        raise ConfigError(f"CA bundle {ca_bundle} does not exist (--ca-bundle)") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"CA bundle {ca_bundle} is not a PEM file of CA certificates ({exc}); "
            "pass the certificate of the CA that signed party B's certificate"
        ) from None


class _Encrypted(Exception):
    pass


def _no_password() -> str:
    raise _Encrypted


def _present(context: ssl.SSLContext, cert: Path, key: Path | None) -> None:
    for path, flag in ((cert, "--client-cert"), (key, "--client-key")):
        if path is not None and not path.is_file():
            raise ConfigError(f"{path} does not exist or is not a file ({flag})")
    try:
        context.load_cert_chain(str(cert), str(key) if key else None, _no_password)
    except _Encrypted:
        raise ConfigError(
            f"the client key {key or cert} is encrypted; party A needs it unencrypted in a "
            f"file only its user can read (openssl pkey -in {key or cert} -out client.key && "
            "chmod 600 client.key)"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"the client key {key} does not belong to the certificate {cert} "
                "(--client-key / --client-cert): pass the key made with this certificate"
            ) from None
        if key is None:
            raise ConfigError(
                f"the client certificate {cert} holds no private key: pass it with --client-key"
            ) from None
        raise ConfigError(
            f"cannot load the client certificate {cert} with key {key} ({exc.reason or exc}); "
            "both must be PEM"
        ) from None
