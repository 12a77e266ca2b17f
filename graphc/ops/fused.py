"""fused ops (being written)."""
