"""graphc.runtime (being written)."""
