"""Which operator limit a request broke, named with the setting that raises it.

The codec refuses a body over a decode limit before allocating anything, but its words are
the wire's (``exceeds max_array_len(16384)``, ``over the limit 16384``): they name neither
party B's limit nor the ``FEDLITE_B_LIMIT_*`` setting an operator would change. When a body
does not decode, ``over_limit`` reads what it *declares* (the number of ids, of chunks, each
chunk's rows, width and quantizer sizes) by walking its map headers and skipping every
payload, and says which limit that is over. It runs only after the decode failed, allocates
nothing the size of the body, and a body it cannot read is left to the codec's 400.
``limit_problem`` is the one 422 of every limit (a run's sizes at creation, ids to align,
a body's): the same sentence, the same members ``limit`` and ``value``.
"""

from dataclasses import dataclass

import msgpack

from api_schemas import ProblemType
from party_b.errors import ProblemError
from shared import codec

__all__ = ["Declared", "declared", "limit_problem", "over_limit", "setting"]

# chunk field -> (the DecodeLimits field that bounds it, what it is)
_CHUNK_SIZES = {
    "d": ("max_dim", "activation width d"),
    "q": ("max_q", "sub-vectors q"),
    "L": ("max_L", "centroids L"),
}
_NOT_A_SETTING = {"max_chunks"}  # fixed by the protocol (docs/PROTOCOL.md 2.2)


@dataclass(frozen=True)
class Declared:
    """What a body's top-level map says about its size, before any payload is read."""

    ids: int | None = None  # entries of ``ids`` (a PredictRequest)
    chunks: int | None = None  # entries of ``a``
    rows: int = 0  # the chunks' ``B`` summed
    sizes: tuple[tuple[str, int], ...] = ()  # the largest d, q, L any chunk declares


def setting(limit: str) -> str:
    """The environment variable of a limit, e.g. ``FEDLITE_B_LIMIT_MAX_BATCH``."""
    return f"FEDLITE_B_LIMIT_{limit.upper()}"


def limit_problem(found: str, limit: str, bound: int) -> ProblemError:
    """422 ``limit-exceeded``: ``found`` is over the operator's ``limit`` (a ``Limits``
    field), named with its setting and the bound, with members ``limit`` and ``value``."""
    return ProblemError(
        ProblemType.LIMIT_EXCEEDED, _sentence(limit, bound, found), limit=limit, value=bound
    )


def over_limit(body: bytes, limits: codec.DecodeLimits) -> tuple[str, str] | None:
    """(the limit's name, a sentence naming it and its setting) when ``body`` declares more
    than ``limits`` allow, else None."""
    seen = declared(body)
    if seen is None:
        return None
    counts = [
        ("max_batch", seen.ids, "ids"),
        ("max_chunks", seen.chunks, "activation chunks"),
        ("max_batch", seen.rows, "activation rows"),
    ]
    for limit, count, what in counts:
        bound = getattr(limits, limit)
        if count is not None and count > bound:
            return limit, _sentence(limit, bound, f"{count:,} {what} in one request")
    for field, value in seen.sizes:
        limit, what = _CHUNK_SIZES[field]
        bound = getattr(limits, limit)
        if value > bound:
            return limit, _sentence(limit, bound, f"{what} = {value:,}")
    return None


def _sentence(limit: str, bound: int, found: str) -> str:
    if limit in _NOT_A_SETTING:
        return f"{found}, over the protocol's limit {limit} = {bound:,}: send fewer per request"
    return (
        f"{found}, over this server's limit {limit} = {bound:,} ({setting(limit)}): stay "
        f"within it, or ask party B's operator to raise {setting(limit)}"
    )


def declared(body: bytes) -> Declared | None:
    """The sizes ``body`` declares, or None when it is not a map this walk can read."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    ids: int | None = None
    chunks: int | None = None
    rows = 0
    largest: dict[str, int] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key == "ids":
                ids = unpacker.read_array_header()
                for _ in range(ids):
                    unpacker.skip()
            elif key == "a":
                chunks = unpacker.read_array_header()
                for _ in range(chunks):
                    rows += _chunk_sizes(unpacker, largest)
            else:
                unpacker.skip()
    except (msgpack.UnpackException, ValueError, TypeError):
        return None
    return Declared(ids, chunks, rows, tuple(sorted(largest.items())))


def _chunk_sizes(unpacker: msgpack.Unpacker, largest: dict[str, int]) -> int:
    """One chunk map's ``B`` (0 if absent); its d, q and L raise ``largest``."""
    rows = 0
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key == "B" or key in _CHUNK_SIZES:
            value = unpacker.unpack()
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{key} is not an integer")
            if key == "B":
                rows = value
            else:
                largest[key] = max(largest.get(key, 0), value)
        else:
            unpacker.skip()
    return rows
