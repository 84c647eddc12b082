"""The command-line tools the deployment tests check files with: Debian's ``haproxy`` and
``kubectl`` (its built-in ``kustomize``). Without one, a test skips with the reason; under
CI (``CI=true``) it fails instead, since .ci/run installs haproxy and the CI machine has
kubectl."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["haproxy_check", "kustomize_build", "require_tool"]


def require_tool(name: str, install: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed: {install}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def haproxy_check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f config`` with ``env`` added to the environment (the file's ${VARS})."""
    haproxy = require_tool("haproxy", "apt-get install -y haproxy (.ci/run does it)")
    return subprocess.run(
        [haproxy, "-c", "-f", str(config)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def kustomize_build(directory: Path) -> str:
    """The manifests ``kubectl kustomize directory`` renders (kustomize built into kubectl)."""
    kubectl = require_tool("kubectl", "kubectl 1.21 or newer (kustomize v4+ built in)")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
