"""party_b."""
