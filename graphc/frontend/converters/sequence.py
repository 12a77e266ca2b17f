"""Converters of sequence ops (being written)."""
