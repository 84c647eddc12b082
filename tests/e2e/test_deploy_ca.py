"""docs/DEPLOY.md section 2, followed to the letter: its openssl commands make a CA, party B's
certificate and party A's client certificate (from a request, the key never leaving party A);
party B then serves with mutual TLS on them and party A connects with them.

The commands are read from the document itself (the ``sh`` blocks of section 2), with the
example host name replaced by ``localhost``: if the document's steps stop working, this fails.
"""

import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

from tests.utils.cli import REPO_ROOT, demo_tables
from tests.utils.servers import PartyBProcess

DEPLOY = REPO_ROOT / "docs" / "DEPLOY.md"


def _section_two_commands() -> str:
    text = DEPLOY.read_text()
    section = text[text.index("## 2. ") : text.index("## 3. ")]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 2, "DEPLOY.md section 2 lost its openssl steps"
    return "\n".join(blocks).replace("partyb.example.org", "localhost")


def _cli(party: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FEDLITE_A_", "FEDLITE_B_"))}
    module = "party_a.cli" if party == "a" else "party_b.ops.cli"
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**clean, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


def test_the_documented_ca_gives_a_working_mutual_tls_deployment(tmp_path: Path) -> None:
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _section_two_commands()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert "party_b.crt: OK" in made.stdout and "party_a.crt: OK" in made.stdout
    subject = re.search(r"subject=(.+)", made.stdout)
    assert subject is not None and subject.group(1).strip() == "CN=bank-a,O=Bank A"
    for secret in ("ca.key", "party_b.key", "party_a.key"):
        assert (tmp_path / secret).stat().st_mode & 0o077 == 0, secret

    features, labels = demo_tables(tmp_path)
    party_b = PartyBProcess(
        tmp_path / "party_b",
        labels,
        {"ops": "ops-token-0123456789abcdef"},
        extra_args=[
            "--ssl-certfile", str(tmp_path / "party_b.crt"),
            "--ssl-keyfile", str(tmp_path / "party_b.key"),
            "--ssl-ca-certs", str(tmp_path / "ca.crt"),
        ],
    )  # fmt: skip
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    trust.check_hostname = (
        False  # the health poll goes to 127.0.0.1, the certificate names localhost
    )
    trust.load_cert_chain(str(tmp_path / "party_a.crt"), str(tmp_path / "party_a.key"))
    party_b.start(verify=trust)
    try:
        issued = _cli(
            "b", "token", "issue", "--name", "bank-a", "--scope", "train", "--expires", "90d",
            "--subject", subject.group(1), "--certificate-only",
            "--data-dir", str(party_b.data_dir),
        )  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        checked = _cli(
            "a", "check", "--server", f"https://localhost:{party_b.port}",
            "--ca-bundle", str(tmp_path / "ca.crt"),
            "--client-cert", str(tmp_path / "party_a.crt"),
            "--client-key", str(tmp_path / "party_a.key"),
        )  # fmt: skip
        healthy = _cli(
            "b", "health", "--port", str(party_b.port),
            env={
                "FEDLITE_B_SSL_CERTFILE": str(tmp_path / "party_b.crt"),
                "FEDLITE_B_SSL_KEYFILE": str(tmp_path / "party_b.key"),
                "FEDLITE_B_SSL_CA_CERTS": str(tmp_path / "ca.crt"),
            },
        )  # fmt: skip
    finally:
        party_b.stop()
    assert checked.returncode == 0, checked.stderr  # the certificate alone, no token
    assert '"ok": true' in checked.stdout
    assert healthy.returncode == 0, healthy.stderr  # party B's own certificate (clientAuth)
