"""elementwise ops (being written)."""
