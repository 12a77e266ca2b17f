"""losses ops (being written)."""
