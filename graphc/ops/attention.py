"""attention ops (being written)."""
