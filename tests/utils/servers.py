"""A real party B: ``fedlite-b serve`` in a subprocess on a free 127.0.0.1 port."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    ) -> None:
        self.data_dir = data_dir
        self.labels = labels
        self.tokens = tokens
        self.port = free_port()
        self.extra_args = extra_args or []
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "party_b.log"
        self.scheme = "https" if "--ssl-certfile" in self.extra_args else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, verify: object = True) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "party_b.cli", "serve",
            "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            "--labels", str(self.labels),
            "--tokens", ",".join(f"{n}:{t}" for n, t in self.tokens.items()),
            "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"party B exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0, verify=verify).status_code == 200:  # type: ignore[arg-type]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()  # never leave a half-started server behind
        raise RuntimeError(f"party B did not come up in {timeout} s:\n{self.log()}")

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

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
