"""Sample alignment behind one interface: which of party A's ids does party B also hold?

Today: ids hashed with HMAC-SHA256 under a per-run key that party B issues with the run.
Party A sends the HMACs of all its ids; party B intersects them with the HMACs of its own.
Party B learns the intersection and the size of party A's id set, but because it also holds
the key it could test guesses of party A's other ids: a private set intersection (ECDH-PSI)
replaces this scheme in a later release, behind the same ``Aligner`` interface.

Either way, the *aligned key* of a sample is its HMAC under the run key, and batch digests are
computed over it. Both parties order the intersection by the *raw* id, which each of them
knows for the samples they share: the order (and with it every batch) then depends only on
the data and the seed, not on the random per-run key, so two runs with the same seed train
identically.
"""

from typing import Protocol

__all__ = ["Aligner", "HmacAligner"]


class Aligner(Protocol):
    def intersect(self, own_keys: set[bytes], offered: list[bytes]) -> set[bytes]:
        """Aligned keys both parties hold (each party orders them by its raw ids)."""
        ...


class HmacAligner:
    """Plain intersection of HMAC'd ids (see the module docstring for what it reveals)."""

    def intersect(self, own_keys: set[bytes], offered: list[bytes]) -> set[bytes]:
        return own_keys.intersection(offered)
