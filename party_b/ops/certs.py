"""Certificates for a replicated party B on one machine (``party_b.ops.stack --mutual-tls``),
made with the ``openssl`` commands of docs/DEPLOY.md section 2 (EC P-256, 365 days).

Two private CAs, for two different trusts:

* ``ca.crt``: the one party A deals with. It signs the load balancer's server certificate
  (names ``localhost`` and ``127.0.0.1``) and the client certificates of the feature parties,
  which the balancer verifies (mutual TLS).
* ``hop-ca.crt``: the hop behind the balancer, between machines of party B only. It signs each
  replica's certificate (server, and client for ``fedlite-b health``) and the balancer's own
  client certificate (subject ``HOP_SUBJECT``), which the replicas require and trust to name
  the caller (``--trusted-proxy-subject``).

Keys are mode 600 in a mode 700 directory; the CA keys stay in it.
"""

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOP_SUBJECT", "StackCertificates", "issue", "make_ca", "stack_certificates"]

HOP_SUBJECT = "CN=fedlite-lb,O=FedLite party B"
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()}")


def make_ca(directory: Path, name: str, common_name: str) -> Path:
    """A self-signed CA ``name.crt`` (key ``name.key``) in ``directory``."""
    _openssl(
        "req", "-x509", *_CURVE, "-days", "365", "-subj", f"/CN={common_name}",
        "-keyout", f"{name}.key", "-out", f"{name}.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    os.chmod(directory / f"{name}.key", 0o600)
    return directory / f"{name}.crt"


def issue(
    directory: Path,
    ca: str,
    name: str,
    subject: str,
    *,
    server_names: tuple[str, ...] = (),
    client: bool = True,
) -> tuple[Path, Path]:
    """``name.crt`` and ``name.key`` signed by the CA ``ca`` (``ca.crt``, ``ca.key``), for
    ``subject`` (OpenSSL's ``/O=.../CN=...``): a server certificate for ``server_names`` (DNS
    names or IP addresses) when given, a client certificate when ``client``."""
    usages = (["serverAuth"] if server_names else []) + (["clientAuth"] if client else [])
    extensions = [
        f"extendedKeyUsage={','.join(usages)}",
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
    ]
    if server_names:
        names = [f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in server_names]
        extensions.append(f"subjectAltName={','.join(names)}")
    (directory / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl("req", *_CURVE, "-subj", subject, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             cwd=directory)  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "365", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip
    os.chmod(directory / f"{name}.key", 0o600)
    (directory / f"{name}.csr").unlink()
    (directory / f"{name}.ext").unlink()
    return directory / f"{name}.crt", directory / f"{name}.key"


@dataclass(frozen=True)
class StackCertificates:
    """The files of one stack's mutual TLS (``directory`` holds them all)."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:  # party A trusts it (--ca-bundle); the balancer verifies clients by it
        return self.path("ca.crt")

    @property
    def hop_ca(self) -> Path:
        return self.path("hop-ca.crt")

    def pem(self, name: str) -> Path:
        """``name``'s certificate and key in one file, as HAProxy reads them."""
        joined = self.path(f"{name}.pem")
        if not joined.exists():
            joined.write_bytes(
                self.path(f"{name}.crt").read_bytes() + self.path(f"{name}.key").read_bytes()
            )
            os.chmod(joined, 0o600)
        return joined


def stack_certificates(
    directory: Path, *, parties: tuple[str, ...] = ("party-a",)
) -> StackCertificates:
    """Both CAs, the balancer's two certificates, one for the replicas, and a client
    certificate for each of ``parties`` (subject ``/O=FedLite demo/CN=<party>``)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_ca(directory, "ca", "FedLite stack CA")
    make_ca(directory, "hop-ca", "FedLite party B hop CA")
    issue(directory, "ca", "lb", "/CN=localhost", server_names=("localhost", "127.0.0.1"),
          client=False)  # fmt: skip
    issue(directory, "hop-ca", "lb-hop", "/O=FedLite party B/CN=fedlite-lb")
    issue(directory, "hop-ca", "replica", "/CN=127.0.0.1", server_names=("127.0.0.1", "localhost"))
    for party in parties:
        issue(directory, "ca", party, f"/O=FedLite demo/CN={party}")
    return StackCertificates(directory)
