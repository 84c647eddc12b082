"""The WAN benchmark's parts: the latency proxy forwards every byte, in order, no sooner than
its delay; the namespace check names why it cannot run (the benchmark then skips)."""

import asyncio
import os
import time

import pytest

from benchmarks.wan import netns
from benchmarks.wan.netproxy import serve
from party_b.ops.launch import free_port


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


def test_the_proxy_delays_each_direction_and_keeps_every_byte_in_order() -> None:
    echo_port, proxy_port, delay = free_port(), free_port(), 0.05
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


def _record(**overrides: object) -> dict[str, object]:
    record: dict[str, object] = {
        "task": "femnist", "mbit": 20.0, "rtt_ms": 40.0, "method_name": "fedlite+default",
        "depth": 4, "steps_per_s": 20.0, "uplink_bytes_per_step": 3_000,
        "downlink_bytes_per_step": 19_000, "wire_up_bytes_per_step": 5_000,
        "wire_down_bytes_per_step": 25_000, "resent": 0, "max_gap_ms": 80.0,
        # 0.05 CPU seconds a step in all: 2 cores allow 40 steps/s
        "cpu_s_per_step": {"party_a": 0.02, "party_b": 0.02, "proxy": 0.01},
    }  # fmt: skip
    record.update(overrides)
    return record


def test_a_runs_bound_is_the_nearer_of_the_links_and_the_cpus() -> None:
    from benchmarks.wan.netns import burst_bytes
    from benchmarks.wan.report import bound, network_bound

    # small messages pass the idle link's bucket at once: four steps per 40 ms round trip
    # allow 100 steps/s, and so does 2.5 MB/s over 25 kB a step
    assert burst_bytes(20.0) > 25_000
    assert network_bound(_record()) == pytest.approx(100.0)
    # a 737 kB gradient does not: 2.5 MB/s over it allows 3.4 steps/s
    float32 = _record(wire_down_bytes_per_step=737_000)
    assert network_bound(float32) == pytest.approx(2.5e6 / 737_000)
    # the CPU: 2 cores over 0.05 CPU seconds a step allow 40 steps/s, nearer than the link
    assert bound(_record(), cores=2) == (pytest.approx(40.0), "cpu")
    light = _record(cpu_s_per_step={"party_a": 0.004, "party_b": 0.004, "proxy": 0.002})
    assert bound(light, cores=2) == (pytest.approx(100.0), "link")


def test_a_points_spread_and_worst_fraction_come_from_its_repeats() -> None:
    from benchmarks.wan.report import points

    doc = {
        "machine": {"cpus": 2},
        "runs": [_record(steps_per_s=v, repeat=i) for i, v in enumerate((36.0, 20.0, 30.0))],
    }

    (point,) = points(doc)

    assert (point["median"], point["low"], point["high"]) == (30.0, 20.0, 36.0)
    assert point["worst_fraction"] == pytest.approx(20.0 / 40.0)
    assert point["bound_kind"] == "cpu"
