"""Waiting for a party B process that was just started (tests, benchmarks, experiments).

Whoever starts ``fedlite-b serve`` as a child process needs the same loop: poll ``/healthz``
until it answers 200, fail at once with the server's log if the process exits, and give up
after a deadline rather than hang.
"""

import ssl
import subprocess
import time
from pathlib import Path

import httpx

__all__ = ["wait_until_healthy"]


def wait_until_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    *,
    log_path: Path,
    timeout: float = 60.0,
    verify: ssl.SSLContext | bool = True,
    poll_seconds: float = 0.1,
) -> None:
    """Return once ``GET {url}/healthz`` answers 200.

    Raises RuntimeError carrying the server's log (``log_path``) when ``process`` exits first
    or ``timeout`` seconds pass; the caller decides whether to stop a process that is still
    running.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"party B exited ({process.returncode}):\n{_read(log_path)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"party B did not come up in {timeout:g} s:\n{_read(log_path)}")
        time.sleep(poll_seconds)


def _read(log_path: Path) -> str:
    try:
        return log_path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {log_path}: {exc})"
