"""The local replicated stack's HAProxy configuration (``party_b.ops.stack``): HAProxy itself
accepts it, and it routes by the run id in the path. (The stack running, with kills:
tests/e2e/test_replicas.py.)"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from party_b.ops.stack import haproxy_config


def test_haproxy_accepts_the_generated_configuration(tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        message = "haproxy is missing: apt-get install haproxy (.ci/run does it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(8080, {"b1": 8001, "b2": 8002, "b3": 8003}))

    checked = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = config.read_text()
    assert "balance uri depth 3" in text and "hash-type consistent" in text  # /v1/runs/<id>
    assert [line.split()[1] for line in text.splitlines() if "server b" in line] == [
        "b1",
        "b2",
        "b3",
    ]
