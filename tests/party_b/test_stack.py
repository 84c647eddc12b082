"""The local replicated stack's HAProxy configuration (``party_b.ops.stack``): HAProxy itself
accepts it, plain and with mutual TLS (real certificates from ``party_b.ops.certs``), and it
routes by the run id as party B reads it. (The stack running, with kills:
tests/e2e/test_replicas.py; requests through it: tests/e2e/test_lb_routing.py.)"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from party_b.ops.certs import stack_certificates
from party_b.ops.stack import RUN_HASH, haproxy_config


def _haproxy() -> str:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        message = "haproxy is missing: apt-get install haproxy (.ci/run does it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return haproxy


@pytest.mark.parametrize("mutual_tls", [False, True])
def test_haproxy_accepts_the_generated_configuration(tmp_path: Path, mutual_tls: bool) -> None:
    haproxy = _haproxy()
    tls = stack_certificates(tmp_path / "tls") if mutual_tls else None
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(8080, {"b1": 8001, "b2": 8002, "b3": 8003}, tls))

    checked = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = config.read_text()
    assert RUN_HASH in text and "path,url_dec,field(4,/)" in RUN_HASH
    assert "hash-type consistent" in text
    assert [line.split()[1] for line in text.splitlines() if "server b" in line] == [
        "b1",
        "b2",
        "b3",
    ]
    if tls is not None:  # client certificates required, the subject passed on, the hop mTLS
        assert f'ca-file "{tls.ca}" verify required' in text
        assert "http-request del-header X-Fedlite-Client-Subject" in text
        assert "%[ssl_c_s_dn(,0,rfc2253)]" in text
        assert f'ssl verify required ca-file "{tls.hop_ca}" crt' in text
