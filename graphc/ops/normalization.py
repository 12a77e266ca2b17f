"""normalization ops (being written)."""
