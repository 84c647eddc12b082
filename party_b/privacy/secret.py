"""A run's privacy: its policy and party B's secret for the policy's random draws.

Its own module so that the mechanisms (``label_dp``, ``defences``) and ``run.protected_step``
can all take it without importing each other.
"""

import hashlib
import secrets
from dataclasses import dataclass

from party_b.privacy.policy import PrivacyPolicy

__all__ = ["OFF", "RunPrivacy", "new_secret"]


def new_secret() -> bytes:
    """A new run's secret: 32 random bytes from the operating system. (Looked up at each
    call, so that a test can draw them from a fixed sequence instead: a verdict must not
    depend on which labels a random secret happened to flip.)"""
    return secrets.token_bytes(32)


@dataclass(frozen=True)
class RunPrivacy:
    """A run's policy and party B's secret for its random draws (32 bytes, never sent)."""

    policy: PrivacyPolicy
    secret: bytes

    @classmethod
    def new(cls, policy: PrivacyPolicy) -> "RunPrivacy":
        return cls(policy, new_secret())

    def seed(self, step: int, purpose: str) -> int:
        """A 63-bit seed for one use at one step, from the secret (SHA-256, stable)."""
        digest = hashlib.sha256(self.secret + f":{step}:{purpose}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1


# runs stored before policies: nothing to draw, and predict answers for every id, as it did
OFF = RunPrivacy(PrivacyPolicy(predict_train_ids=True), b"")
