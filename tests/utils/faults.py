"""A seeded fault-injecting HTTP/1.1 proxy on 127.0.0.1, between party A and party B.

It reads each request whole from party A, draws a fault from its own ``random.Random(seed)``
(in the order requests arrive), and then:

* ``PASS``      forwards the request and returns the answer;
* ``DELAY``     forwards, then holds the answer for 50-300 ms;
* ``RESET``     resets the connection before forwarding (party B never sees the request);
* ``DROP``      forwards (party B acts on it) and closes the connection without the answer;
* ``TRUNCATE``  forwards, sends half of the answer and resets the connection;
* ``STALL``     forwards, then holds the answer longer than party A's timeout (A retries);
* ``LATE``      resets the connection at once (party A retries) but forwards the request
                ``stall_s`` later: party B gets a stale duplicate after party A moved on.

Every request goes to party B on a fresh connection; when party B is down the client's
connection is simply closed. A TLS ClientHello (party A asking whether the port speaks TLS)
is counted in ``tls_hellos`` and never answered, as a middlebox waiting for HTTP would. Only
what party A's ``HttpTransport`` sends is supported: Content-Length bodies, no chunked
uploads (``Transfer-Encoding`` is refused).
"""

import asyncio
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Fault", "FaultPlan", "FaultProxy"]


class Fault(StrEnum):
    PASS = "pass"
    DELAY = "delay"
    RESET = "reset"
    DROP = "drop"
    TRUNCATE = "truncate"
    STALL = "stall"
    LATE = "late"


@dataclass
class FaultPlan:
    """Which faults, how often, and how long the slow ones last."""

    seed: int
    weights: dict[Fault, float] = field(default_factory=lambda: {Fault.PASS: 1.0})
    script: list[Fault] = field(default_factory=list)  # faults of the first requests, in order
    delay_s: tuple[float, float] = (0.05, 0.3)
    stall_s: float = 2.0  # longer than the client's timeout


def _content_length(head: bytes) -> int:
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            raise ValueError("chunked bodies are not supported by the fault proxy")
        if name == b"content-length":
            length = int(value.strip())
    return length


async def _read_message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head + await reader.readexactly(_content_length(head))


_TLS_HANDSHAKE = b"\x16"  # the first byte of a TLS record carrying a handshake message


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) rather than an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Run the proxy in a background thread: ``with FaultProxy(...) as proxy: proxy.url``."""

    def __init__(self, upstream_port: int, plan: FaultPlan) -> None:
        self.upstream_port = upstream_port
        self.plan = plan
        self.counts: Counter[Fault] = Counter()
        self.requests: list[tuple[str, Fault]] = []  # (request line, fault), arrival order
        self.tls_hellos = 0  # connections that opened with a TLS handshake (left unanswered)
        self._rng = random.Random(plan.seed)
        self._script = list(plan.script)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("fault proxy did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(self._server.wait_closed())
        self._loop.close()

    def _draw(self, request_line: str) -> Fault:
        with self._lock:
            if self._script:
                fault = self._script.pop(0)
            else:
                kinds = list(self.plan.weights)
                fault = self._rng.choices(kinds, [self.plan.weights[k] for k in kinds])[0]
            self.counts[fault] += 1
            self.requests.append((request_line, fault))
            return fault

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    first = await reader.readexactly(1)
                    if first == _TLS_HANDSHAKE:
                        with self._lock:
                            self.tls_hellos += 1
                        await reader.read()  # silent until the client gives up
                        return
                    request = first + await _read_message(reader)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                line = request.split(b"\r\n", 1)[0].decode("latin-1")
                fault = self._draw(line)
                if fault is Fault.RESET:
                    _reset(writer)
                    return
                if fault is Fault.LATE:
                    _reset(writer)  # the client sees a dead connection and retries...
                    await asyncio.sleep(self.plan.stall_s)
                    await self._forward(request)  # ...and party B gets the stale copy later
                    return
                response = await self._forward(request)
                if response is None or fault is Fault.DROP:
                    _reset(writer)
                    return
                if fault is Fault.TRUNCATE:
                    writer.write(response[: len(response) // 2])
                    await writer.drain()
                    _reset(writer)
                    return
                if fault is Fault.DELAY:
                    await asyncio.sleep(self._rng_delay())
                if fault is Fault.STALL:
                    await asyncio.sleep(self.plan.stall_s)
                writer.write(response)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            # cancelled at shutdown: end quietly (asyncio's streams log a cancelled handler)
            return
        finally:
            self._tasks.discard(task)
            writer.close()

    def _rng_delay(self) -> float:
        with self._lock:
            return self._rng.uniform(*self.plan.delay_s)

    async def _forward(self, request: bytes) -> bytes | None:
        """Send one request to party B on a fresh connection; None when party B is down."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            return None
        try:
            writer.write(request)
            await writer.drain()
            return await _read_message(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return None
        finally:
            writer.close()
