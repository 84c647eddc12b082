"""A run's privacy: its policy and party B's secrets for the policy's random draws.

Its own module so that the mechanisms (``label_dp``, ``defences``) and ``run.protected_step``
can all take it without importing each other.

A run's stored secret (table ``run_privacy``) is its own 32 random bytes, for everything it
draws itself (gradient noise, and the randomized labels of a run created before label draws
existed), followed under label DP by the 32-byte key of its label table's draw
(``draws.draw_key``), from which its randomized labels come: one layout, read by every
process that loads the run, so that the run's labels are the same after any restart.
"""

import hashlib
import secrets
from dataclasses import dataclass

from party_b.privacy.policy import PrivacyPolicy

__all__ = ["OFF", "RUN_SECRET_BYTES", "RunPrivacy", "new_secret"]


def new_secret() -> bytes:
    """A new run's secret: 32 random bytes from the operating system. (Looked up at each
    call, so that a test can draw them from a fixed sequence instead: a verdict must not
    depend on which labels a random secret happened to flip.)"""
    return secrets.token_bytes(32)


RUN_SECRET_BYTES = 32


@dataclass(frozen=True)
class RunPrivacy:
    """A run's policy and party B's secret for its random draws (never sent): the run's own
    32 bytes, then, for a run whose labels come from its table's draw, that draw's key."""

    policy: PrivacyPolicy
    secret: bytes

    @classmethod
    def new(cls, policy: PrivacyPolicy, label_key: bytes | None = None) -> "RunPrivacy":
        """A new run's privacy: a secret of its own, and the key of its table's label draw
        (None: no label DP)."""
        return cls(policy, new_secret() + (label_key or b""))

    @property
    def label_key(self) -> bytes | None:
        """The key of the label draw the run's randomized labels come from; None for a run
        that draws them from its own secret (created before label draws) or has none."""
        key = self.secret[RUN_SECRET_BYTES:]
        return key or None

    def seed(self, step: int, purpose: str) -> int:
        """A 63-bit seed for one use at one step, from the run's own secret (SHA-256,
        stable)."""
        own = self.secret[:RUN_SECRET_BYTES]
        digest = hashlib.sha256(own + f":{step}:{purpose}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1


# runs stored before policies: nothing to draw, and predict answers for every id, as it did
OFF = RunPrivacy(PrivacyPolicy(predict_train_ids=True), b"")
