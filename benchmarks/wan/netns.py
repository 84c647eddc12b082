"""Two network namespaces joined by a veth pair, bandwidth shaped with ``tc ... tbf``.

    namespace A (party A, latency proxy)  10.77.0.1 --veth-- 10.77.0.2  namespace B (party B)

Both ends of the veth get a tbf at the scenario's rate, so each direction has the bandwidth
on its own (a symmetric link). Latency is added in user space (``benchmarks.wan.netproxy``):
this kernel has no netem. Everything is removed again on exit, on error and on SIGTERM.
"""

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["Link", "burst_bytes", "link", "unavailable"]

NS_A, NS_B = "fedlite-wan-a", "fedlite-wan-b"
DEV_A, DEV_B = "fedlite-va", "fedlite-vb"
ADDR_A, ADDR_B = "10.77.0.1", "10.77.0.2"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (run as root or in a privileged container)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command (iproute2) is not installed"
    probe = subprocess.run(
        ["ip", "netns", "add", "fedlite-wan-probe"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"'ip netns add' is not allowed here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", "fedlite-wan-probe"], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def in_ns(namespace: str, command: list[str]) -> list[str]:
    """``command`` run inside ``namespace``."""
    return ["ip", "netns", "exec", namespace, *command]


@dataclass(frozen=True)
class Link:
    ns_a: str = NS_A
    ns_b: str = NS_B
    addr_a: str = ADDR_A
    addr_b: str = ADDR_B
    dev_a: str = DEV_A  # party A's end of the veth pair, in namespace A

    def shape(self, mbit: float) -> None:
        """Both directions at ``mbit`` Mbit/s. The bucket holds 4 ms at the rate but at least
        64 KiB: veth hands tbf segments of up to 64 KiB (GSO), bigger than a bucket would
        drop them."""
        burst = burst_bytes(mbit)
        for ns, dev in ((self.ns_a, DEV_A), (self.ns_b, DEV_B)):
            _ip(
                "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{mbit}mbit", "burst", str(burst), "latency", "400ms",
            )  # fmt: skip


def burst_bytes(mbit: float) -> int:
    """The tbf bucket at ``mbit`` Mbit/s (``Link.shape``): 4 ms at the rate, at least 64 KiB
    and a frame. A link idle long enough to fill it passes that many bytes at once."""
    return max(int(mbit * 1e6 / 8 * 0.004), 65536 + 1514)


def _remove() -> None:
    for ns in (NS_A, NS_B):
        _ip("netns", "delete", ns, check=False)  # deleting it removes its veth end too


@contextmanager
def link() -> Iterator[Link]:
    """The two namespaces and the veth pair; removed on exit (and on SIGTERM)."""
    _remove()  # leftovers of a run that was killed with SIGKILL
    previous = signal.getsignal(signal.SIGTERM)

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    try:
        for ns in (NS_A, NS_B):
            _ip("netns", "add", ns)
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _ip("link", "add", DEV_A, "netns", NS_A, "type", "veth", "peer", DEV_B, "netns", NS_B)
        for ns, dev, addr in ((NS_A, DEV_A, ADDR_A), (NS_B, DEV_B, ADDR_B)):
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", dev)
            _ip("netns", "exec", ns, "ip", "link", "set", dev, "up")
        yield Link()
    finally:
        _remove()
        signal.signal(signal.SIGTERM, previous)
