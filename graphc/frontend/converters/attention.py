"""Converters of attention ops (being written)."""
