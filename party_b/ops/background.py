"""Party B in the current Python process, over real HTTP on 127.0.0.1: for a notebook, an
example or a test, with the same app ``fedlite-b serve`` runs.

    from party_b.ops.background import serve_in_thread

    with serve_in_thread(labels="guest.csv", data_dir="party_b") as party_b:
        print(party_b.url, party_b.token)   # what party A connects with (party_a.api.connect)

uvicorn serves in a daemon thread; leaving the block shuts it down gracefully (the database is
checkpointed as on SIGTERM). A deployment runs ``fedlite-b serve`` instead (docs/DEPLOY.md):
TLS, its own process, an operator-issued token.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from party_b.api import create_app
from party_b.settings import Settings
from party_b.token_text import new_token

__all__ = ["BackgroundPartyB", "serve_in_thread"]


@dataclass(frozen=True)
class BackgroundPartyB:
    url: str  # http://127.0.0.1:<port>
    token: str  # a bearer token registered for this party B (name "local")


@contextmanager
def serve_in_thread(
    *,
    labels: str | Path,
    data_dir: str | Path,
    token: str | None = None,
    port: int = 0,
    start_timeout: float = 60.0,
    **settings: Any,
) -> Iterator[BackgroundPartyB]:
    """Serve party B on 127.0.0.1 for the duration of the block.

    Args:
        labels: party B's label table (id column ``id``, label column ``y`` unless
            ``id_column=`` / ``label_column=`` say otherwise).
        data_dir: where its SQLite database goes (kept: a later call resumes its runs).
        token: the bearer token to register (default: a fresh random one).
        port: 0 picks a free port.
        settings: any other ``party_b.settings.Settings`` field (``limits=``, ...).
    """
    token = token or new_token(24)
    app = create_app(
        Settings(data_dir=Path(data_dir), labels=Path(labels), tokens=f"local:{token}", **settings)
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="party-b", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("party B did not start (see the log above)")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]  # the port 0 chose
    try:
        yield BackgroundPartyB(url=f"http://127.0.0.1:{bound}", token=token)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
