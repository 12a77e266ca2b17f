"""Converters of normalization ops (being written)."""
