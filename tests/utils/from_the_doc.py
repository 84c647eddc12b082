"""The derived values of docs/PROTOCOL.md section 9, written from that text alone.

An outside implementer's view: plain Python with hashlib and hmac, no numpy and no import
from shared/, party_a/, party_b/ or api_schemas/. tests/contract/test_conformance.py runs it
on every conformance vector; if the text left something out, this would disagree with the
reference code somewhere. Lists are plain lists of ints; bytes are bytes.
"""

import hashlib
import hmac


def key64(text: str) -> bytes:
    """First 8 bytes of SHA-256 of the ASCII text (compared as bytes = as big-endian uint64)."""
    return hashlib.sha256(text.encode("ascii")).digest()[:8]


def order(prefix: str, n: int) -> list[int]:
    """9.2: 0..n-1 sorted by (key64(prefix + decimal(i)), i)."""
    return sorted(range(n), key=lambda i: (key64(f"{prefix}{i}"), i))


# ------------------------------------------------------------------ 9.1 aligned keys


def aligned_key(alignment_key_hex: str, sample_id: str) -> bytes:
    return hmac.new(bytes.fromhex(alignment_key_hex), sample_id.encode("utf-8"), "sha256").digest()


def aligned_list(alignment_key_hex: str, ids: list[str]) -> list[bytes]:
    """The aligned keys of ``ids`` (all held by both parties), by raw id's UTF-8 bytes."""
    return [aligned_key(alignment_key_hex, i) for i in sorted(ids, key=lambda i: i.encode("utf-8"))]


# ------------------------------------------------------------------ 9.3 split


def round_half_up(x: float) -> int:
    whole = int(x)  # x >= 0
    return whole + 1 if x - whole >= 0.5 else whole


def eval_size(n: int, eval_fraction: float) -> int:
    p = round_half_up(eval_fraction * 1_000_000)
    return min(n - 1, (n * p + 500_000) // 1_000_000)


def split(n: int, seed: int, eval_fraction: float) -> tuple[list[int], list[int]]:
    """(train, eval), both ascending."""
    o = order(f"split:{seed}:", n)
    n_eval = eval_size(n, eval_fraction)
    return sorted(o[n_eval:]), sorted(o[:n_eval])


# ------------------------------------------------------------------ 9.4 shuffle


def shuffle_batch(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Train positions of step ``step`` (from 1): the step-th slice of the epoch stream."""
    start, stop = (step - 1) * batch_size, step * batch_size
    epochs = {e: order(f"shuffle:{seed}:{e}:", n) for e in range(start // n, (stop - 1) // n + 1)}
    return [epochs[k // n][k % n] for k in range(start, stop)]


# ------------------------------------------------------------------ 9.5 clients


def clients_batch(
    names: list[str], clients_per_step: int, batch_size: int, seed: int, step: int
) -> tuple[list[str], list[int], list[int]]:
    """(chosen client names, train positions in row order, chunk sizes) of step ``step``."""
    clients = sorted(set(names), key=lambda c: c.encode("utf-8"))
    members = [[i for i, c in enumerate(names) if c == name] for name in clients]
    chosen = sorted(order(f"clients:{seed}:{step}:", len(clients))[:clients_per_step])
    batch: list[int] = []
    chunks: list[int] = []
    for j in chosen:
        m = len(members[j])
        rows = order(f"rows:{seed}:{step}:{j}:", m)[: min(batch_size, m)]
        batch += [members[j][r] for r in rows]
        chunks.append(len(rows))
    return [clients[j] for j in chosen], batch, chunks


# ------------------------------------------------------------------ 9.6, 9.7


def step_seed(seed: int, step: int, purpose: str) -> int:
    return int.from_bytes(key64(f"{seed}:{step}:{purpose}"), "big") >> 1


def digest(keys: list[bytes]) -> bytes:
    h = hashlib.sha256()
    for key in keys:
        h.update(len(key).to_bytes(2, "big") + key)
    return h.digest()[:8]
