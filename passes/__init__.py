"""graphc.passes (being written)."""
