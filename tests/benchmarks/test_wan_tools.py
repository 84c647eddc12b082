"""The WAN benchmark's parts: the latency proxy forwards every byte, in order, no sooner than
its delay; the namespace check names why it cannot run (the benchmark then skips)."""

import asyncio
import os
import socket
import time

import pytest

from benchmarks.wan import netns
from benchmarks.wan.netproxy import serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


def test_the_proxy_delays_each_direction_and_keeps_every_byte_in_order() -> None:
    echo_port, proxy_port, delay = _free_port(), _free_port(), 0.05
    payload = os.urandom(3 << 20)  # 3 MiB: many chunks each way

    async def scenario() -> tuple[float, bytes]:
        echo = await asyncio.start_server(_echo, "127.0.0.1", echo_port)
        proxy = asyncio.ensure_future(
            serve(("127.0.0.1", proxy_port), ("127.0.0.1", echo_port), delay)
        )
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        started = time.monotonic()
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        round_trip = time.monotonic() - started
        writer.write(payload)
        received = await asyncio.wait_for(reader.readexactly(len(payload)), 60)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(4 * delay)  # the proxy passes the close on, both ways
        proxy.cancel()
        echo.close()
        await asyncio.gather(proxy, return_exceptions=True)
        return round_trip, received

    round_trip, received = asyncio.run(scenario())
    assert received == payload
    assert round_trip >= 2 * delay


def test_without_root_the_benchmark_says_why_it_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = netns.unavailable()
    assert reason is not None and "root" in reason
