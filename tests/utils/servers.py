"""A real party B: ``fedlite-b serve`` in a subprocess on a free 127.0.0.1 port."""

import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from party_b.ops.launch import free_port, wait_until_healthy
from tests.utils.data import breast_pair

REPO_ROOT = Path(__file__).resolve().parents[2]
ALICE = "alice-token-0123456789"
MALLORY = "mallory-token-0123456789"

__all__ = ["ALICE", "MALLORY", "REPO_ROOT", "PartyBProcess", "breast_party_b", "free_port"]


class PartyBProcess:
    """Start, SIGKILL and restart party B on the same database and port."""

    def __init__(
        self,
        data_dir: Path,
        labels: Path,
        tokens: dict[str, str],
        *,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        module: str = "party_b.ops.cli",
    ) -> None:
        self.data_dir = data_dir
        self.labels = labels
        self.tokens = tokens
        self.port = free_port()
        self.extra_args = extra_args or []
        self.env = env or {}
        self.module = module  # e.g. tests.utils.party_b_faulty: the same CLI with a fault hook
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "party_b.log"
        self.scheme = "https" if "--ssl-certfile" in self.extra_args else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0, verify: ssl.SSLContext | bool = True) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", self.module, "serve",
            "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            "--labels", str(self.labels),
            "--tokens", ",".join(f"{n}:{t}" for n, t in self.tokens.items()),
            "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            cwd=REPO_ROOT,
        )
        log.close()
        try:
            wait_until_healthy(
                self.url, self.proc, log_path=self.log_path, timeout=timeout, verify=verify
            )
        except RuntimeError:
            self.stop()  # never leave a half-started server behind
            raise

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    @property
    def database(self) -> Path:
        return self.data_dir / "party_b.sqlite"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def breast_party_b(
    data_dir: Path, tokens: dict[str, str] | None = None, **kwargs: Any
) -> Iterator[PartyBProcess]:
    """``fedlite-b serve`` on FATE's breast guest table (alice's token by default), started
    and stopped around the block; ``kwargs`` go to :class:`PartyBProcess`."""
    guest, _host = breast_pair()  # skips (or fails in CI) without ../shared/data
    server = PartyBProcess(data_dir, guest, tokens or {"alice": ALICE}, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()
