"""Converters of elementwise ops (being written)."""
