"""A PQ chunk's entropy-coded codewords decoded from docs/PROTOCOL.md section 3.1 alone.

An outside implementer's view: the standard library only, nothing from shared/.
tests/contract/test_conformance.py runs it on every codewords vector.
"""

import struct

M = 1 << 15


def codewords(cf: bytes, ca: bytes, B: int, q: int, R: int, L: int) -> list[list[int]]:
    """The (B, q) codewords of the frequency tables ``cf`` and the stream ``ca``."""
    f = [list(struct.unpack(f"<{L}H", cf[2 * L * r : 2 * L * (r + 1)])) for r in range(R)]
    assert len(cf) == 2 * R * L and all(sum(row) == M for row in f), "bad tables"
    c = [[sum(row[:s]) for s in range(L)] for row in f]
    x, p = int.from_bytes(ca[:4], "little"), 4
    out = []
    for i in range(B * q):
        r = (i % q) // (q // R)
        slot = x % M
        s = next(s for s in range(L) if c[r][s] <= slot < c[r][s] + f[r][s])
        out.append(s)
        x = f[r][s] * (x >> 15) + slot - c[r][s]
        while x < 1 << 23:
            x = (x << 8) | ca[p]  # IndexError past the end: malformed
            p += 1
    assert p == len(ca) and x == 1 << 23, "bytes left or not the initial state"
    return [out[row * q : (row + 1) * q] for row in range(B)]
