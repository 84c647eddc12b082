"""Starting ``fedlite-b serve`` as a child process and waiting for it (tests, benchmarks,
load tests, experiments).

Whoever starts party B as a child process needs the same loop: poll ``/healthz`` until it
answers 200, fail at once with the server's log if the process exits, and give up after a
deadline rather than hang. ``local_party_b`` does all of it on a free 127.0.0.1 port.
"""

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

__all__ = [
    "MALLOC_TUNING",
    "child_process",
    "free_port",
    "local_party_b",
    "reserve_port",
    "wait_until_healthy",
]

# glibc returns freed buffers above 128 KiB to the OS and faults them back in on the next
# request (~2.4 us per 4 KiB page here); a 737 KB gradient per step pays that every time.
# These keep them (docs/PERFORMANCE.md).
MALLOC_TUNING = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "268435456"}


_handed_out: set[int] = set()  # ports this process gave away: never the same one twice


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the moment of asking), from
    20000-31999, below the ephemeral range of common kernels (32768 up), and never one this
    process handed out or reserved before.

    Why not port 0's choice: a child binds its port only after its imports and warm-up,
    seconds later, and meanwhile the kernel may give that port to an outgoing connection
    (a replica failed with "address already in use"); and two calls in a row may get the
    same port back before either is bound. Falls back to port 0's choice if 1,000 draws find
    nothing free."""
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(20000, 32000)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def reserve_port(port: int) -> None:
    """Never hand out ``port``: a port this process was given to listen on later (the
    stack's balancer port, chosen by the process that started it)."""
    _handed_out.add(port)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def local_party_b(
    data_dir: Path,
    labels: Path,
    tokens: Mapping[str, str],
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60.0,
) -> Iterator[str]:
    """``fedlite-b serve`` on a free 127.0.0.1 port with ``data_dir`` and the label table
    ``labels``, the ``tokens`` {name: token} registered; yields its URL and SIGTERMs it at the
    end. Its output goes to ``data_dir / "party_b.log"``; ``env`` adds to this process's, and
    ``cwd`` (where ``python -m`` looks first) can run another checkout's party B."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "party_b.ops.cli", "serve",
        "--port", str(port),
        "--data-dir", str(data_dir),
        "--labels", str(labels),
        "--log-level", "warning",
        *extra_args,
    ]  # fmt: skip
    # the tokens in the environment, not on a command line anyone can read with ps
    listed = ",".join(f"{name}:{token}" for name, token in tokens.items())
    environment = {**os.environ, **(env or {}), "FEDLITE_B_TOKENS": listed}
    log_path = data_dir / "party_b.log"
    with child_process(cmd, log_path, env=environment, cwd=cwd) as proc:
        wait_until_healthy(url, proc, log_path=log_path, timeout=timeout)
        yield url


@contextmanager
def child_process(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    grace_seconds: float = 20.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` as a child process, its stdout and stderr appended to ``log_path``; at the end
    SIGTERM (party B's graceful stop: finish the step in hand, close the store), then SIGKILL
    if it has not exited after ``grace_seconds``."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
