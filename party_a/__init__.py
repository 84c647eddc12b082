"""party_a."""
