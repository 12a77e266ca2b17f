"""Converters of nn ops (being written)."""
