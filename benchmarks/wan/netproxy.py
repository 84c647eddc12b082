"""A TCP proxy that adds a fixed one-way delay in each direction (latency in user space).

This kernel has no netem, so the WAN benchmark shapes bandwidth with ``tc ... tbf`` on a veth
pair and adds latency here: every chunk read from one side is written to the other
``delay`` seconds after it was read, in order. Reading never waits for writing, so the delay
does not throttle throughput (a bandwidth-delay product's worth of bytes is simply in the
proxy's queue, as it would be in flight on a long link); the bandwidth is the tbf's.

One difference from a real long link, stated where the numbers are: TCP's own congestion
control sees the short veth hop, not the delay, so slow start over a long RTT is not modelled
(large transfers look somewhat better than on a real WAN).

    python -m benchmarks.wan.netproxy --listen 127.0.0.1:9000 --target 10.77.0.2:8000 --delay-ms 20
"""

import argparse
import asyncio
import contextlib
import time

__all__ = ["serve"]

CHUNK = 1 << 16


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader -> writer, each chunk released ``delay`` seconds after it arrived."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while True:
            data = await reader.read(CHUNK)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()


async def _connection(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _pump(client_reader, server_writer, delay),
            _pump(server_reader, client_writer, delay),
        )
    except (ConnectionError, OSError):
        pass
    finally:
        for w in (client_writer, server_writer):
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    """Proxy connections to ``listen`` on to ``target``, ``delay`` seconds each way."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _connection(r, w, target, delay)

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="host:port")
    parser.add_argument("--target", type=_address, required=True, help="host:port")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.target, args.delay_ms / 1000.0))


if __name__ == "__main__":
    main()
